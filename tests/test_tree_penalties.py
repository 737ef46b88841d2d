"""``engines/tree/penalties.py`` against vLLM's definitions on a toy vocabulary, node by node:
each node of a draft tree penalised with its own path's tokens (siblings differ), exactly."""

from __future__ import annotations

import pytest
import torch

from batchspec.engines.tree.penalties import RowPenalties, active, open_penalties
from batchspec.engines.tree.shape import DraftTree
from batchspec.spec.sampling import SamplingSpec

V = 7


def reference(
    logit: list[float], prompt: list[int], output: list[int], s: SamplingSpec, eos: set[int]
) -> list[float]:
    """vLLM's penalties for one position, written out token by token (its apply_penalties,
    then MinTokensLogitsProcessor)."""
    out = []
    for t, x in enumerate(logit):
        if t in prompt or t in output:
            x = x / s.repetition_penalty if x > 0 else x * s.repetition_penalty
        x -= s.frequency_penalty * output.count(t)
        x -= s.presence_penalty * (t in output)
        if len(output) < s.min_tokens and t in eos:
            x = float("-inf")
        out.append(x)
    return out


SETTINGS = [
    SamplingSpec(repetition_penalty=1.3),
    SamplingSpec(repetition_penalty=0.7, frequency_penalty=0.5),
    SamplingSpec(frequency_penalty=-0.4, presence_penalty=1.1),
    SamplingSpec(presence_penalty=0.3, min_tokens=4),
    SamplingSpec(repetition_penalty=1.2, frequency_penalty=0.2, presence_penalty=0.1, min_tokens=3),
]


@pytest.mark.parametrize("s", SETTINGS)
def test_every_node_is_penalised_along_its_own_path(s: SamplingSpec) -> None:
    gen = torch.Generator().manual_seed(1)
    prompt, output = [0, 5, 5], [2, 3]
    # root (the row's last token, 3) -> 4 -> 2 -> 4 ; root -> 1 ; node 1 -> 3
    tree = DraftTree([3, 4, 1, 2, 3, 4], [-1, 0, 0, 1, 1, 3])
    logits = torch.randn(tree.size, V, generator=gen, dtype=torch.float64) * 3
    pen = RowPenalties(s, prompt, V, torch.device("cpu"))
    pen.extend(output)
    got = pen.apply(logits, tree, {6})
    paths = {0: [], 1: [4], 2: [1], 3: [4, 2], 4: [4, 3], 5: [4, 2, 4]}
    for node, path in paths.items():
        want = reference(logits[node].tolist(), prompt, output + path, s, {6})
        assert got[node].tolist() == pytest.approx(want, abs=1e-12), node
    # The next token after a prefill (no tree): the row's output alone.
    first = RowPenalties(s, prompt, V, torch.device("cpu")).apply(logits[:1], None, {6})
    assert first[0].tolist() == pytest.approx(reference(logits[0].tolist(), prompt, [], s, {6}))


def test_only_settings_that_change_a_logit_open_state() -> None:
    assert (
        not active(SamplingSpec())
        and open_penalties(SamplingSpec(), [1], torch.zeros(1, V)) is None
    )
    assert all(active(s) for s in SETTINGS)
