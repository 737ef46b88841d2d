"""Sampled decoding through the tree engine, computed exactly: penalties, ``min_tokens`` and
log-probabilities on n-gram trees, on a toy vocabulary.

``test_tree_accept`` proves ``accept_sampled`` lossless alone, and ``test_tree_penalties`` the
penalties alone; neither shows that the engine samples from the penalised distribution (an
engine whose sampled acceptance took the raw logits passed both: error 0.58, an end of row
before ``min_tokens`` with probability 0.59), nor that the log-probabilities it writes are the
raw model's (tempered or penalised ones passed every tree test, which only compared K=4 with
K=0 through the same code). Here the target is a table (``Table``: a fixed pseudo-random logit
row per context, float64), the engine runs whole rows with the n-gram drafter at K=4, and every
random draw a row makes goes through a walk (``Walk``) that follows each outcome with its exact
probability, one engine run per path. The rows' distribution must equal plain decoding's, as
vLLM defines it (penalties written out in ``test_tree_penalties.reference``, then temperature,
top-k and top-p by ``target_probs``, itself checked against vLLM's), to 1e-12.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import job_dict
from support.walks import ScriptedDraws, every_path
from test_tree_penalties import reference

from batchspec.engines.base import ListSource
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.load import Target
from batchspec.engines.tree.rows import target_probs
from batchspec.spec import JobSpec
from batchspec.spec.sampling import SamplingSpec
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

V, EOS, MAX_TOKENS = 4, 3, 3
PROMPT = [0, 1, 2, 0, 1, 0, 2, 0]
"""Its suffixes recur, so n-gram trees branch (after 0: 1 and 2) and reach two deep."""
PENALTIES = {"repetition_penalty": 1.4, "frequency_penalty": 0.5, "presence_penalty": 0.3}
SETTINGS = {"temperature": 0.7, "min_tokens": 2, "logprobs": 2, **PENALTIES}
Dist = dict[tuple[int, ...], float]


def logits_at(context: list[int]) -> torch.Tensor:
    """The table's logits [V] after ``context``: a fixed pseudo-random row per context."""
    gen = torch.Generator().manual_seed(hash((97, *context)) % 2**62)
    return torch.rand(V, generator=gen, dtype=torch.float64) * 4 - 2


class Table:
    """The tree engine's model interface over ``logits_at``: per slot the committed tokens;
    a node's logits are those of its slot's tokens and its path from the root (the mask)."""

    def __init__(self, max_batch: int, max_len: int) -> None:
        self.max_batch, self.max_len, self.device = max_batch, max_len, torch.device("cpu")
        self.seq: dict[int, list[int]] = {}
        self.fed: dict[int, list[int]] = {}

    @property
    def cache_len(self) -> list[int]:
        return [len(self.seq.get(s, [])) for s in range(self.max_batch)]

    def prefill(self, slot: int, tokens: list[int]) -> torch.Tensor:
        self.seq[slot] = list(tokens)
        return logits_at(self.seq[slot])

    def share_prefix(self, src: int, dst: int, n: int) -> None:
        self.seq[dst] = self.seq[src][:n]

    def verify(self, slots, tokens, positions, tree_mask, sizes=None) -> torch.Tensor:
        out = torch.zeros(*tokens.shape, V, dtype=torch.float64)
        for b, slot in enumerate(slots):
            self.fed[slot] = tokens[b].tolist()
            for i in range(tokens.shape[1]):
                path = sorted(
                    tree_mask[b, i].nonzero().flatten().tolist(), key=positions[b].__getitem__
                )
                out[b, i] = logits_at(self.seq[slot] + [self.fed[slot][j] for j in path])
        return out

    def commit(self, slot: int, nodes: list[int]) -> None:
        self.seq[slot] += [self.fed[slot][n] for n in nodes]

    def release(self, slot: int) -> None:
        self.seq.pop(slot, None)


class Walk(ScriptedDraws):
    """``ScriptedDraws`` for a whole row: coins and tokens both branch (a token drawn changes
    every later step)."""

    def categorical(self, p: torch.Tensor) -> int:
        q = (p / p.sum()).tolist()
        return int(self.pick(list(enumerate(q))))  # type: ignore[arg-type]


def engine(k: int, **sampling) -> TreeEngine:
    spec = JobSpec.model_validate(
        job_dict(
            Path("unused"),
            model={"max_num_seqs": 2, "max_model_len": 56},
            speculative={"engine": "tree", "num_speculative_tokens": 4, "adaptive": False,
                         "tree": {"max_depth": 2}},
            sampling={"max_tokens": MAX_TOKENS, **sampling},
        )
    )  # fmt: skip
    return TreeEngine(spec, k, target=Target(Table(2, 64), Letters(), {EOS}, 56))


class Letters:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


def walked(eng: TreeEngine) -> list[tuple[float, RowResult]]:
    """Every way the engine can decode ``PROMPT``, with its exact probability."""
    unit = WorkUnit(0, "in.parquet", 0, 1, None, 1)

    def run(walk: Walk) -> RowResult:
        eng.draws = lambda gen: walk
        todo = ListSource([UnitRequests(unit, [RowRequest(0, 0, None, {}, list(PROMPT))])])
        (res,) = eng.run(todo, lambda: False)
        return res.results[0]

    return [(walk.weight, row) for walk, row in every_path(Walk, run)]


def plain(s: SamplingSpec, raw: bool = False) -> Dist:
    """vLLM's plain decoding of ``PROMPT`` under ``s``, every sequence with its probability
    (``raw``: without penalties or ``min_tokens``)."""
    out: Dist = {}
    stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while stack:
        seq, weight = stack.pop()
        if len(seq) == MAX_TOKENS or (seq and seq[-1] == EOS):
            out[seq] = out.get(seq, 0.0) + weight
            continue
        row = logits_at(PROMPT + list(seq))
        if not raw:
            row = torch.tensor(
                reference(row.tolist(), PROMPT, list(seq), s, {EOS}), dtype=torch.float64
            )
        probs = target_probs(row.unsqueeze(0), s)[0].tolist()
        stack.extend(((*seq, t), weight * p) for t, p in enumerate(probs) if p > 0)
    return out


def distance(a: Dist, b: Dist) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.fixture(scope="module")
def runs() -> list[tuple[float, RowResult]]:
    return walked(engine(4, **SETTINGS))


def dist(runs: list[tuple[float, RowResult]]) -> Dist:
    out: Dist = {}
    for weight, r in runs:
        out[tuple(r.token_ids)] = out.get(tuple(r.token_ids), 0.0) + weight
    return out


@pytest.mark.parametrize("top", [{}, {"top_k": 3, "top_p": 0.8}], ids=["full", "top-k-top-p"])
def test_sampled_trees_with_penalties_and_min_tokens_decode_as_plain_decoding_exactly(
    top: dict, runs
) -> None:
    """Every row the engine can emit, weighed by its draws, against plain decoding under the
    same settings: equal to 1e-12, no end of row before ``min_tokens``, while penalties and
    ``min_tokens`` move plain decoding's distribution by far more (the check can fail), and
    trees were drafted and accepted on the way."""
    s = SamplingSpec(max_tokens=MAX_TOKENS, **{**SETTINGS, **top})
    got = dist(runs if not top else walked(engine(4, **SETTINGS, **top)))
    want = plain(s)
    assert abs(sum(got.values()) - 1) < 1e-12
    assert distance(got, want) < 1e-12
    assert not any(EOS in seq[: s.min_tokens] for seq in got)
    assert distance(want, plain(s, raw=True)) > 0.05
    assert any(r.spec and r.spec.accepted for _, r in runs)


def test_logprobs_are_the_raw_models_at_every_position(runs) -> None:
    """Each emitted token's log-probabilities (first token, accepted draft tokens, bonus
    tokens) are the raw logits' log-softmax at its context, as vLLM reports them: not the
    tempered or penalised distribution the token was sampled from. The top 2 and the chosen
    token, within float32's rounding."""
    positions = 0
    for _, r in runs:
        assert r.top_logprobs is not None and len(r.top_logprobs) == len(r.token_ids)
        for i, (tok, got) in enumerate(zip(r.token_ids, r.top_logprobs, strict=True)):
            want = torch.log_softmax(logits_at(PROMPT + r.token_ids[:i]), -1)
            top = set(torch.topk(want, 2).indices.tolist()) | {tok}
            assert set(got) == top
            assert all(math.isclose(got[t], float(want[t]), abs_tol=1e-6) for t in top)
            positions += 1
    assert positions > 100
