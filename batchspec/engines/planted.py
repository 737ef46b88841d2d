"""A planted bias for tests of ``batchspec verify``, off unless set: a broken speculative
sampler that must make verify fail.

``BATCHSPEC_INJECT_ACCEPT_ALL=1`` makes vLLM's rejection sampler accept every draft token
whatever the target says (then the target's bonus token after them, as when all drafts pass):
the engine still drafts and verifies for real, only the acceptance rule is broken. Greedy rows
then follow n-gram drafts the target would not have chosen, and sampled rows lean towards the
drafts. vLLM's own lossy switch for this (``rejection_sample_method: synthetic``) is not
implemented by its CPU kernels, hence the patch. It patches this process's vLLM, so the engine
must run in it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). The tree engine reads the same switch
and accepts each tree's first-ranked path down to its leaf.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ACCEPT_ALL_ENV = "BATCHSPEC_INJECT_ACCEPT_ALL"


def planted_on() -> bool:
    """Whether the planted bias is on: the tree engine then accepts every draft token along
    each tree's first-ranked path, whatever the target says."""
    return os.environ.get(ACCEPT_ALL_ENV) == "1"


def maybe_plant_bias() -> None:
    """Before an engine starts: patch vLLM's acceptance rule when the test asks for it."""
    if not planted_on():
        return
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError(f"{ACCEPT_ALL_ENV} needs VLLM_ENABLE_V1_MULTIPROCESSING=0")
    from vllm.v1.sample import rejection_sampler as rs

    original = rs.rejection_sample
    if getattr(original, "planted", False):
        return

    @functools.wraps(original)
    def accept_all(
        draft_token_ids: Any,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: Any,
        draft_probs: Any,
        target_logits: Any,
        bonus_token_ids: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        out = original(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
            draft_probs, target_logits, bonus_token_ids, *args, **kwargs,
        )  # fmt: skip
        start = 0
        for i, n in enumerate(num_draft_tokens):
            drafts = draft_token_ids[start : start + n]
            start += n
            if n and bool((drafts >= 0).all()):
                out[i, :n] = drafts
                out[i, n] = bonus_token_ids.reshape(-1)[i]
        return out

    accept_all.planted = True  # type: ignore[attr-defined]
    rs.rejection_sample = accept_all
