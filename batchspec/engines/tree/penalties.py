"""Penalties and ``min_tokens`` on the tree engine, with vLLM's exact semantics, per tree node.

A penalty depends on the tokens before the position it applies to, and in a draft tree those
differ between siblings: node i's logits predict the token after the row's output so far plus
the draft tokens on the path from the root down to node i (the root itself is the row's last
emitted token, already in its output). So each node is penalised with its own path's counts,
before acceptance, greedy rows included: the acceptance rule is lossless only against the
distribution the target actually samples from, and plain decoding (K=0: a root alone) applies
the same penalties to the same output tokens.

vLLM's definitions (``vllm.model_executor.layers.utils.apply_penalties``, in this order):

- repetition: a token seen in the prompt or the output has its logit divided by the penalty
  where positive, multiplied where not;
- frequency: minus the penalty times the token's count in the output;
- presence: minus the penalty where the token is in the output at all;
- ``min_tokens``: while the output is shorter, the end-of-sequence tokens are impossible
  (``MinTokensLogitsProcessor``); stop strings are not looked for before then either.

Log-probabilities written to the output stay the raw model's, as vLLM reports them.
"""

from __future__ import annotations

import torch

from batchspec.engines.tree.shape import DraftTree
from batchspec.spec.sampling import SamplingSpec


def active(s: SamplingSpec) -> bool:
    """Whether the settings change any logit (no work, no state otherwise)."""
    return (
        s.repetition_penalty != 1.0
        or s.frequency_penalty != 0.0
        or s.presence_penalty != 0.0
        or s.min_tokens > 0
    )


def open_penalties(s: SamplingSpec, prompt: list[int], logits: torch.Tensor) -> RowPenalties | None:
    """A row's penalty state, or None when its settings change no logit."""
    return RowPenalties(s, prompt, logits.shape[-1], logits.device) if active(s) else None


class RowPenalties:
    """One row's penalty state: which tokens its prompt holds, how often each was generated."""

    def __init__(self, s: SamplingSpec, prompt: list[int], vocab: int, device: torch.device):
        self.s = s
        self.prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.prompt[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        self.counts = torch.zeros(vocab, dtype=torch.float64, device=device)
        self.length = 0
        self._eos: tuple[tuple[frozenset[int], torch.device], torch.Tensor] | None = None

    def extend(self, tokens: list[int]) -> None:
        """Tokens emitted into the row's output."""
        idx = torch.tensor(tokens, dtype=torch.long, device=self.counts.device)
        self.counts.index_add_(0, idx, torch.ones_like(idx, dtype=torch.float64))
        self.length += len(tokens)

    def apply(self, logits: torch.Tensor, tree: DraftTree | None, eos: set[int]) -> torch.Tensor:
        """``logits`` [N, V] of the tree's nodes (or [1, V] of the next token when ``tree`` is
        None), penalised per node along its own path; a new float64 tensor. Everything
        [N, V] is made on the logits' device: from the host come only the paths' (node,
        token) pairs and the nodes' depths, a few hundred integers (a [N, V] one-hot built on
        the host was ~11 MB a row and step at 152k tokens)."""
        n, vocab = logits.shape
        dev = logits.device
        counts = self.counts.to(dev).expand(n, vocab).clone()
        depth = [0] * n
        if tree is not None and n > 1:
            # Node i's extra output: the draft tokens of its ancestors-or-self below the root.
            pairs: list[int] = []
            for i in range(1, n):
                j = i
                while j > 0:
                    pairs += (i, tree.tokens[j])
                    j = tree.parents[j]
            depth = tree.depths()
            at = torch.tensor(pairs, dtype=torch.long, device=dev).view(-1, 2)
            ones = torch.ones(at.shape[0], dtype=counts.dtype, device=dev)
            counts.index_put_((at[:, 0], at[:, 1]), ones, accumulate=True)
        out = logits.to(torch.float64).clone()
        s = self.s
        if s.repetition_penalty != 1.0:
            seen = (counts > 0) | self.prompt.to(dev)
            scaled = torch.where(out > 0, out / s.repetition_penalty, out * s.repetition_penalty)
            out = torch.where(seen, scaled, out)
        out -= s.frequency_penalty * counts
        out -= s.presence_penalty * (counts > 0).to(out.dtype)
        if s.min_tokens > 0 and eos:
            short = [self.length + d < s.min_tokens for d in depth]
            if any(short):
                rows = torch.tensor(short, dtype=torch.bool, device=dev)
                out.masked_fill_(rows.unsqueeze(1) & self._eos_mask(eos, dev), float("-inf"))
        return out

    def _eos_mask(self, eos: set[int], dev: torch.device) -> torch.Tensor:
        """Bool [V]: the end-of-sequence tokens, made once per row on the logits' device."""
        key = (frozenset(eos), dev)
        if self._eos is None or self._eos[0] != key:
            mask = torch.zeros(self.prompt.shape[0], dtype=torch.bool, device=dev)
            mask[torch.tensor(sorted(eos), dtype=torch.long, device=dev)] = True
            self._eos = (key, mask)
        return self._eos[1]
