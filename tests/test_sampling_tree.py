"""The sampling keys on the tree engine, on a small random Llama of the test's own (about a
second): a prompt's n samples share one prefill, a row's own settings (``sampling.columns``:
temperature, max_tokens) are the ones it decodes with, and logprobs come back top-k."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import job_dict

from batchspec.engines.base import ListSource
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.load import Target
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.weights import convert, llama_config, random_weights
from batchspec.spec import JobSpec
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

VOCAB, MAX_LEN = 40, 96
TINY = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": VOCAB,
    "max_position_embeddings": MAX_LEN, "initializer_range": 0.5,
}  # fmt: skip
NGRAM = {"engine": "tree", "num_speculative_tokens": 4, "adaptive": False}


pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread


class Letters:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


def engine(
    k: int, logprobs: int | None = None, eos: set[int] = frozenset(), **sampling
) -> TreeEngine:
    cfg = llama_config(TINY)
    weights = convert(cfg, random_weights(cfg, torch.float32, "cpu"), torch.float32, "cpu")
    model = TreeModel(cfg, weights, "cpu", 4, MAX_LEN)
    spec = JobSpec.model_validate(
        job_dict(
            Path("unused"),
            model={"max_num_seqs": 4, "max_model_len": MAX_LEN - 8},
            speculative=NGRAM,
            sampling={"max_tokens": 24, "logprobs": logprobs, **sampling},
        )
    )
    return TreeEngine(spec, k, target=Target(model, Letters(), set(eos), MAX_LEN - 8))


def run(eng: TreeEngine, reqs: list[RowRequest]) -> list[RowResult]:
    unit = WorkUnit(0, "in.parquet", 0, len(reqs), None, len(reqs))
    results = [
        r
        for res in eng.run(ListSource([UnitRequests(unit, reqs)]), lambda: False)
        for r in res.results
    ]
    return results


PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7, 8], [20, 21, 22, 23, 20, 21]]


def test_a_prompts_samples_share_one_prefill_and_each_row_uses_its_own_settings() -> None:
    eng = engine(4, logprobs=2, temperature=0.9)
    job = eng.spec.sampling
    greedy = job.model_copy(update={"temperature": 0.0})
    short = job.model_copy(update={"max_tokens": 5})
    reqs = [
        RowRequest(i, i, None, {}, p, seed=100 * i + j, sample_index=j, sampling=s)
        for i, p in enumerate(PROMPTS)
        for j, s in enumerate([None, greedy, short])
    ]
    got = run(eng, reqs)
    assert eng.shared_prefills == 2 * len(PROMPTS)  # samples 1, 2 of each prompt copied
    plain = run(
        engine(0, temperature=0.0), [RowRequest(i, i, None, {}, p) for i, p in enumerate(PROMPTS)]
    )
    for i in range(len(PROMPTS)):
        sampled, as_greedy, cut = got[3 * i : 3 * i + 3]
        # The row with temperature 0 from its column decodes greedily, exactly as plain
        # greedy decoding does; the row with max_tokens 5 stops there.
        assert as_greedy.token_ids == plain[i].token_ids
        assert sampled.token_ids != as_greedy.token_ids
        assert cut.num_output_tokens == 5 and cut.finish_reason == "length"
        assert len(sampled.token_ids) == 24
    for r in got:
        assert len(r.top_logprobs) == len(r.token_ids)
        assert all(2 <= len(pos) <= 3 for pos in r.top_logprobs)


@pytest.mark.parametrize("k_top", [1, 20])
def test_greedy_logprobs_with_trees_equal_plain_decodings(k_top: int) -> None:
    """Every generated token's top-k log-probabilities, from verify forwards of K=4 trees,
    are plain decoding's (same tokens, values within 1e-4 nats) in float32."""
    reqs = [RowRequest(i, i, None, {}, p) for i, p in enumerate(PROMPTS)]
    plain = run(engine(0, logprobs=k_top), reqs)
    trees = run(engine(4, logprobs=k_top), reqs)
    assert any(r.spec and r.spec.accepted for r in trees)  # trees were accepted
    for a, b in zip(plain, trees, strict=True):
        assert a.token_ids == b.token_ids
        for pa, pb in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert pa.keys() == pb.keys() and len(pa) in (k_top, k_top + 1)
            assert max(abs(pa[t] - pb[t]) for t in pa) < 1e-4


PENALTIES = {"repetition_penalty": 0.8, "frequency_penalty": -0.3, "presence_penalty": 0.2}
"""Negative penalties among them: rows repeat themselves, so n-gram trees are accepted."""


def test_greedy_trees_with_penalties_and_min_tokens_equal_plain_decoding() -> None:
    """Penalties change the rows (they are applied), and K=4 trees, every node penalised along
    its own path, give plain decoding's rows token for token; an end-of-sequence token is
    impossible before min_tokens."""
    reqs = [RowRequest(i, i, None, {}, p) for i, p in enumerate(PROMPTS)]
    raw = run(engine(0), reqs)
    plain = run(engine(0, **PENALTIES), reqs)
    trees = run(engine(4, **PENALTIES), reqs)
    assert [r.token_ids for r in plain] != [r.token_ids for r in raw]
    assert [r.token_ids for r in trees] == [r.token_ids for r in plain]
    assert any(r.spec and r.spec.accepted for r in trees)
    # min_tokens: every token but 0 ends a row, and none may before 6 tokens.
    eng = engine(4, eos=set(range(1, VOCAB)), min_tokens=6, **PENALTIES)
    for r in run(eng, reqs):
        assert len(r.token_ids) >= 7 and set(r.token_ids[:-1]) == {0}
        assert r.finish_reason == "stop" and r.token_ids[-1] != 0
