"""The distribution the tree engine samples from (``rows.target_probs``) against vLLM's rules:
temperature, then top-k, then top-p; top-k keeps ties at its cut; top-p keeps the smallest
set of most probable tokens whose mass reaches p (at least one), dropping the lower token ids
first among ties at its cut. Hand-made logits with exact expected probabilities, then random
logits against vLLM's own PyTorch function (where vLLM is installed).

``verify`` cannot catch a wrong rule here: it compares the tree engine with itself at K=0,
which samples from the same function.
"""

from __future__ import annotations

import math

import pytest
import torch

from batchspec.engines.tree.rows import target_probs
from batchspec.spec import SamplingSpec


def probs(weights: list[float], temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0):
    """target_probs of the logits whose softmax at ``temperature`` is ``weights`` normalised:
    log-weights times the temperature (so the expected values are exact fractions)."""
    logits = torch.tensor([[math.log(w) * temperature for w in weights]], dtype=torch.float64)
    spec = SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p)
    return target_probs(logits, spec)[0].tolist()


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) < 1e-12 for g, w in zip(got, want, strict=True))


CASES = [
    # (weights, temperature, top_k, top_p, expected)
    ([1, 2, 4, 1], 0.5, -1, 1.0, [1 / 8, 2 / 8, 4 / 8, 1 / 8]),
    ([1, 2, 4, 1], 1.0, 2, 1.0, [0, 1 / 3, 2 / 3, 0]),
    ([1, 2, 2, 4], 1.0, 2, 1.0, [0, 1 / 4, 1 / 4, 2 / 4]),  # top-k keeps ties at its cut
    ([1, 2, 4, 1], 1.0, 4, 1.0, [1 / 8, 2 / 8, 4 / 8, 1 / 8]),  # k = vocabulary: no cut
    ([1, 1, 2, 4], 1.0, -1, 0.75, [0, 0, 1 / 3, 2 / 3]),  # mass exactly p: enough
    ([1, 1, 2, 4], 1.0, -1, 0.5, [0, 0, 0, 1]),
    ([1, 1, 2, 4], 1.0, -1, 0.500001, [0, 0, 1 / 3, 2 / 3]),
    ([1, 1, 2, 4], 1.0, -1, 0.76, [0, 1 / 7, 2 / 7, 4 / 7]),  # a tie at the cut: id 1 kept
    ([2, 2, 2, 2], 1.0, -1, 0.5, [0, 0, 1 / 2, 1 / 2]),
    ([1, 8, 1, 1], 1.0, -1, 0.01, [0, 1, 0, 0]),  # at least the most probable token
    ([4, 4, 1, 1], 1.0, -1, 0.01, [0, 1, 0, 0]),  # ... of tied ones, the higher id
    # Order: top-k (2 of [1, 2, 5, 8]: 5/13, 8/13), then top-p 0.6 on that: 8 alone. Top-p
    # first would keep 5 and 8 (0.8125 of the mass) and top-k then both.
    ([1, 2, 5, 8], 1.0, 2, 0.6, [0, 0, 0, 1]),
    # Temperature first: [1, 4, 16, 64] at T=2 is [1, 2, 4, 8] / 15, whose top 0.6 is 4 and
    # 8; top-p on the raw weights would keep 64 alone.
    ([1, 2, 4, 8], 2.0, -1, 0.6, [0, 0, 1 / 3, 2 / 3]),
]


@pytest.mark.parametrize(("weights", "temperature", "top_k", "top_p", "want"), CASES)
def test_hand_made_logits(weights, temperature, top_k, top_p, want) -> None:
    assert close(probs(weights, temperature, top_k, top_p), want)


def test_rows_are_independent_and_the_dtype_is_float64() -> None:
    logits = torch.log(torch.tensor([[1.0, 1, 2, 4], [4, 2, 1, 1]], dtype=torch.float64))
    got = target_probs(logits, SamplingSpec(temperature=1.0, top_p=0.75))
    assert got.dtype == torch.float64
    assert close(got[0].tolist(), [0, 0, 1 / 3, 2 / 3])
    assert close(got[1].tolist(), [2 / 3, 1 / 3, 0, 0])


def vllm_probs(logits: torch.Tensor, s: SamplingSpec) -> torch.Tensor:
    """vLLM's sampler on the same logits: float32, temperature divided in place
    (``Sampler.apply_temperature``), then its top-k/top-p function, then softmax."""
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    x = logits.to(torch.float32).clone().div_(s.temperature)
    rows = x.shape[0]
    k = torch.full((rows,), s.top_k, dtype=torch.long) if s.top_k > 0 else None
    p = torch.full((rows,), s.top_p, dtype=torch.float32) if s.top_p < 1.0 else None
    return ops.apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True).softmax(-1)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_random_logits_match_vllm(temperature: float) -> None:
    gen = torch.Generator().manual_seed(int(temperature * 10))
    logits = torch.randn(16, 2000, generator=gen) * 4
    logits[3, :50] = logits[3, 0]  # a row with many exact ties
    for top_k in (-1, 1, 7, 300):
        for top_p in (1.0, 0.95, 0.6, 0.1):
            s = SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p)
            want, got = vllm_probs(logits, s), target_probs(logits, s)
            assert torch.equal(want > 0, got > 0), (top_k, top_p)
            assert (want.double() - got).abs().max() < 1e-6, (top_k, top_p)
