"""One row in the tree engine's batch: its slot, what it has generated, its speculative counts
and timing, and when it is done; and the distribution its tokens are sampled from.

The row's *root* is the last token chosen for it, whose KV is not yet in the cache: every step
verifies a tree under the root, and the step's bonus token becomes the next root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from batchspec.spec import SamplingSpec
from batchspec.units import RowRequest, RowResult, SpecStats

LOGPROB_TOP = 5


def target_probs(logits: torch.Tensor, s: SamplingSpec) -> torch.Tensor:
    """The distribution rows sample from: logits [N, V] after temperature, top-k and top-p,
    in that order, by vLLM's rules (its PyTorch sampler, ``apply_top_k_top_p_pytorch``);
    float64 so that acceptance ratios and residuals are exact enough.

    Top-k keeps every token whose logit reaches the k-th largest (ties at the cut are all
    kept). Top-p keeps the smallest set of most probable tokens whose mass reaches top_p, and
    always the most probable one; vLLM sorts ascending and drops a token when the mass at or
    below it is <= 1 - top_p, so of tokens tied at the cut it drops the lower ids first (its
    GPU kernels may break such exact ties otherwise). The same set is summed here from the
    top down: the mass above a token >= top_p drops it."""
    logits = logits.to(torch.float64) / s.temperature
    if s.top_k > 0 and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        ascending, order = torch.sort(probs, dim=-1, stable=True)
        sorted_p, order = ascending.flip(-1), order.flip(-1)  # ties: higher ids first
        drop = (sorted_p.cumsum(-1) - sorted_p) >= s.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass(eq=False)
class TreeRow:
    """A row being decoded; ``owner``/``index`` locate its result in its unit."""

    req: RowRequest
    owner: Any
    index: int
    slot: int
    max_tokens: int
    draws: Any
    """Its random draws (``accept.Draws``): every token it samples, one source per row."""
    queued: float
    scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    root: int = -1
    prefill_logits: torch.Tensor | None = None
    out: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    finish: str | None = None
    text: str | None = None
    penalty: Any = None
    """Penalty and ``min_tokens`` state (``penalties.RowPenalties``); None without."""
    k: int = 0
    """The draft node budget this row decodes at, its unit's K (0: plain decoding)."""
    drafter: str = ""
    """The drafter its trees come from, its unit's (``speculative.drafters``)."""
    view: int | None = None
    """Where its domain's index stood for it (``drafting.Learner.view``); None without one."""

    def emit(self, tokens: list[int], stops: Stops, lps: list[dict[int, float]] | None) -> int:
        """Append a step's tokens up to the first that ends the row (EOS, a stop string,
        ``max_tokens``); the rest are dropped, as if the row had stopped there. Returns how
        many were kept."""
        now = time.monotonic()
        if not self.out:
            self.first_token = now
        kept = 0
        for i, tok in enumerate(tokens):
            self.out.append(tok)
            kept += 1
            if self.logprobs is not None and lps is not None:
                self.logprobs.append(lps[i])
            self.finish = stops.check(self.out, self.max_tokens)
            if self.finish is not None:
                break
        self.root = self.out[-1]
        self.last_token = now
        return kept

    def count_step(self, drafted_nodes: int, depth: int, path: int, kept: int, cap: int) -> None:
        """A verify step's counts, vLLM's names: steps that checked at least one draft, draft
        tokens verified, accepted ones, and the histogram by accepted depth. ``path`` draft
        tokens were accepted, of which only those among the ``kept`` emitted ones count: a row
        that ended inside its path (EOS or a stop string there) accepted nothing after its end
        (vLLM counts them; its counts are taken before the stop check)."""
        if drafted_nodes == 0:
            return
        accepted = min(path, kept)
        self.steps += 1
        self.drafted += drafted_nodes
        self.accepted += accepted
        if len(self.histogram) < cap + 1:
            self.histogram.extend([0] * (cap + 1 - len(self.histogram)))
        self.histogram[accepted] += 1
        # The geometric acceptance model's failures: a step that stopped above the tree's
        # deepest node (speculation.estimator.rejected_steps). A row that ended inside its
        # path rejected nothing: its draft reached the end, as deep as the row could go.
        self.per_step_drafted.append(depth if kept > path else accepted)
        self.per_step_accepted.append(accepted)

    def result(self, tokenizer: Any, speculative: bool) -> RowResult:
        spec = None
        if speculative:
            spec = SpecStats(
                steps=self.steps,
                drafted=self.drafted,
                accepted=self.accepted,
                histogram=tuple(self.histogram or [0]),
                per_step_drafted=tuple(self.per_step_drafted),
                per_step_accepted=tuple(self.per_step_accepted),
            )
        text = (
            self.text
            if self.text is not None
            else tokenizer.decode(self.out, skip_special_tokens=True)
        )
        return RowResult(
            request=self.req,
            text=text,
            num_prompt_tokens=len(self.req.prompt_token_ids or []),
            num_output_tokens=len(self.out),
            finish_reason=self.finish,
            spec=spec,
            timing={
                "queued": self.queued,
                "scheduled": self.scheduled,
                "first_token": self.first_token,
                "last_token": self.last_token,
            },
            token_ids=list(self.out),
            top_logprobs=self.logprobs,
            suffix_view=self.view,
        )


class Stops:
    """When a row is done: an end-of-sequence token, a stop string, or ``max_tokens``."""

    def __init__(self, eos_ids: set[int], stop: list[str], tokenizer: Any):
        self.eos_ids = eos_ids
        self.stop = stop
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in stop), default=0) + 8
        """Tokens decoded to look for a stop string that the last token may complete: no
        token is shorter than one character."""

    def check(self, out: list[int], max_tokens: int) -> str | None:
        if out[-1] in self.eos_ids:
            return "stop"
        if self.stop:
            tail = self.tokenizer.decode(out[-self.window :], skip_special_tokens=True)
            if any(s in tail for s in self.stop):
                return "stop"
        return "length" if len(out) >= max_tokens else None

    def text(self, out: list[int]) -> str:
        """The row's text, cut before its first stop string (vLLM leaves stop strings out)."""
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        cut = min((i for s in self.stop if (i := text.find(s)) >= 0), default=len(text))
        return text[:cut]


def top_logprobs(
    logits: torch.Tensor, chosen: list[int], k: int = LOGPROB_TOP
) -> list[dict[int, float]]:
    """Per position (rows of ``logits``), the target's top-``k`` log-probabilities and the
    chosen token's, from the raw logits as vLLM reports them."""
    lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    top = torch.topk(lp, k, dim=-1)
    out = []
    for i, tok in enumerate(chosen):
        entry = dict(zip(top.indices[i].tolist(), top.values[i].tolist(), strict=True))
        entry[tok] = float(lp[i, tok])
        out.append(entry)
    return out
