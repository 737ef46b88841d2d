"""Replayed acceptance (``speculation/replay.py``): vLLM's n-gram proposer reproduced exactly,
hand-worked rows, and on the tree engine's loop (small models, no vLLM engine) replay at the
K that ran equal to the real counts on every row, greedy and sampled; at another K, sampled,
the replay's acceptance agrees with a real run at that K within its standard error."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import job_dict
from test_tree_loop import NGRAM, SUFFIX, cycle_model, engine, random_prompts, run

from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Observation
from batchspec.speculation.replay import Replayer, ngram_starts, replay_chain, vllm_lookup
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work.feeding import Replays


def test_ngram_starts_are_vllms_own_proposals() -> None:
    """Random contexts over small alphabets (many repeats, overlapping matches), every
    lookup range, K and room before max_model_len: the draft from ``ngram_starts`` is the
    one vLLM 0.32's own proposer function returns, on every context."""
    ngram = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    vllm_propose = ngram._find_longest_matched_ngram_and_propose_tokens
    rng = random.Random(1)
    checked = 0
    for _ in range(150):
        toks = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randint(1, 50))]
        lo = rng.randint(1, 4)
        hi = rng.randint(lo, 6)
        first = rng.randint(1, len(toks))
        starts = ngram_starts(toks, first, lo, hi)
        for m in range(first, len(toks) + 1):
            k, max_len = rng.randint(1, 8), m + rng.randint(0, 10)
            want = vllm_propose(np.array(toks[:m], dtype=np.int32), lo, hi, max_len, k).tolist()
            s, room = starts[m - first], min(k, max_len - m)
            got = toks[s : s + min(room, m - s)] if s >= 0 and room > 0 else []
            assert got == want, (toks[:m], lo, hi, k, max_len)
            checked += 1
    assert checked > 1000


def test_a_hand_worked_chain_at_every_k() -> None:
    """Prompt 5 6 7 8 5 6, output 7 8 5 6 7, n-grams of 2. After the first token (7) the
    suffix (6, 7) last... first occurred at positions 1-2, so drafts copy from position 3:
    8 5 6 7. K=1: two steps of one accepted token each (the second from the suffix (8, 5));
    K=3: one step, three accepted, then the last token alone; K=8: the draft is cut at the
    context (4 tokens) and all four are accepted, the row's end included. max_model_len 9
    leaves room for 2 drafts in the first step, none after."""
    tokens = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    starts = ngram_starts(tokens, 7, 2, 2)
    assert starts[:3] == [3, 4, 5]
    assert replay_chain(tokens, 6, starts, 1, 100) == (2, 2, 2, False)
    assert replay_chain(tokens, 6, starts, 3, 100) == (1, 3, 3, False)
    # K=8 drafted 8 5 6 7 (the context's four) and the row ended after 7.
    assert replay_chain(tokens, 6, starts, 8, 100) == (1, 4, 4, False)
    assert replay_chain(tokens, 6, starts, 8, 9) == (1, 2, 2, False)
    # Cut the row after 8 5: at K=3 the draft 8 5 6 matched up to the end, 6 left over.
    assert replay_chain(tokens[:9], 6, starts, 3, 100) == (1, 3, 2, True)


def test_vllm_lookup_defaults() -> None:
    assert vllm_lookup(None, None) == (5, 5)
    assert vllm_lookup(2, None) == (2, 2)
    assert vllm_lookup(None, 4) == (4, 4)
    assert vllm_lookup(1, 3) == (1, 3)


def vllm_spec(method: str = "ngram", **speculative: object) -> JobSpec:
    speculative |= {"method": method, "prompt_lookup_min": 2, "prompt_lookup_max": 2}
    return JobSpec.model_validate(job_dict(Path("unused"), speculative=speculative))


def vllm_replayer(grid: list[int], method: str = "ngram") -> Replayer:
    return Replayer(vllm_spec(method), "vllm", grid, 100)


def test_the_replayer_gives_a_row_per_k_and_none_where_it_cannot() -> None:
    row = RowResult(RowRequest(0, "a", None, {}, [5, 6, 7, 8, 5, 6]), token_ids=[7, 8, 5, 6, 7])
    assert vllm_replayer([0, 1, 3, 8]).row(row) == [0, 2, 3, 4]
    assert vllm_replayer([0, 3], "suffix").row(row) is None
    failed = RowResult(RowRequest(0, "a", None, {}, [5, 6]), error="too long")
    assert vllm_replayer([0, 3]).row(failed) is None


def test_the_drafts_each_k_proposed_reach_the_units_observation() -> None:
    """The worker's replay (``feeding.Replays``) hands the controller, beside the accepted
    drafts, the drafts proposed at each K (the hand-worked row: 2 at K=1, 3 at K=3, the
    context's 4 at K=8): what the domain's drafts cost, from its first unit at any K."""
    replays = Replays(vllm_spec(k_grid=[0, 1, 3, 8]))
    replays.engine_up(SimpleNamespace(name="vllm", k=0, max_model_len=100))
    request = RowRequest(0, "a", "d", {}, [5, 6, 7, 8, 5, 6])
    row = RowResult(request, num_output_tokens=5, token_ids=[7, 8, 5, 6, 7])
    unit = UnitResult(UnitRequests(WorkUnit(0, "x", 0, 1, "d", 1)), [row], 0, "ngram", "vllm")
    replays.replay(unit)
    assert row.replayed == {0: 0, 1: 2, 3: 3, 8: 4}
    assert Observation.from_result(unit, 8).replay == [
        [0, 4, 0, 0],
        [1, 4, 2, 2],
        [3, 4, 3, 3],
        [8, 4, 4, 4],
    ]


def test_tree_replay_counts_the_nodes_each_k_drafts() -> None:
    """The tree engine's n-gram trees (n-grams of 1, depth 4) on a hand-worked row: prompt
    9 7 8 9 7 6, output 9 7 5 6. After the first token (9) the context's 9s were followed by
    7 8 9 7 6 9 and 7 6 9, whose trie is 7 -> {8 -> 9 -> 7, 6 -> 9}: six nodes within depth
    4, 7 ranked first (two continuations). K=1 drafts 7, K=2 7 and one child, K=4 four
    nodes, K=8 all six (fewer than K: the trie has no more); each accepts the 7 alone (the
    output goes on with 5). The next step's root, 5, never occurred before: no tree. So
    three decode tokens in two steps, and the nodes drafted at K are 1, 2, 4 and 6: what the
    row's steps cost (``Controller.fill_cost``), handed to the unit's ``Observation`` as
    vLLM's drafts are, per drafter too (a suffix drafter that learned nothing yet drafts the
    n-gram trie)."""
    speculative = {"engine": "tree", "method": "ngram", "drafters": ["ngram", "suffix"]}
    speculative |= {"prompt_lookup_min": 1, "prompt_lookup_max": 1, "k_grid": [0, 1, 2, 4, 8]}
    spec = JobSpec.model_validate(
        job_dict(Path("unused"), speculative={**speculative, "tree": {"max_depth": 4}})
    )
    replays = Replays(spec)
    replays.engine_up(SimpleNamespace(name="tree", k=0, max_model_len=100))
    request = RowRequest(0, "a", "d", {}, [9, 7, 8, 9, 7, 6])
    row = RowResult(request, num_output_tokens=4, token_ids=[9, 7, 5, 6])
    unit = UnitResult(UnitRequests(WorkUnit(0, "x", 0, 1, "d", 1)), [row], 0, "ngram", "tree")
    replays.replay(unit)
    assert row.replayed == {0: 0, 1: 1, 2: 1, 4: 1, 8: 1}
    assert row.replayed_drafted == {0: 0, 1: 1, 2: 2, 4: 4, 8: 6}
    want = [[0, 3, 0, 0], [1, 3, 1, 1], [2, 3, 1, 2], [4, 3, 1, 4], [8, 3, 1, 6]]
    ob = Observation.from_result(unit, 1)
    assert ob.replay == want and ob.replays == {"ngram": want, "suffix": want}


def tree_replayer(eng, grid: list[int]) -> Replayer:
    return Replayer(eng.spec, "tree", grid, eng.max_model_len)


def test_tree_replay_equals_the_engines_counts_greedy_and_sampled() -> None:
    """The tree engine's loop at K=4 (n-gram trees, depth 4) on the cycle model with loud
    layers (trees accepted in part), greedy and sampled (temperature 1): the replayer's count
    at K=4 is each row's real accepted count on every row. Sampled rows too, since the
    emitted token equals a draft child exactly when the one-hot rule accepted it. The nodes
    replay counts at K=4 are the engine's own drafted nodes on every row: each tree is drawn
    from committed tokens alone."""
    rows = random_prompts(8, 10, seed=3)
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    for sampling in ({}, {"temperature": 1.0, "seed": 5}):
        eng = engine(model, 4, NGRAM, {7}, **sampling)
        got = run(eng, rows, [i for i in range(len(rows))] if sampling else None)
        replayer = tree_replayer(eng, [0, 2, 4])
        real = [r.spec.accepted if r.spec else 0 for r in got]
        assert sum(real) > 0
        assert [replayer.row(r)[2] for r in got] == real
        assert all(replayer.row(r)[0] == 0 for r in got)
        nodes = []
        for r in got:
            replayer.row(r)
            nodes.append(replayer.drafted["ngram"][4])
        assert nodes == [r.spec.drafted if r.spec else 0 for r in got] and sum(nodes) > 0


def test_suffix_replay_at_batch_1_equals_the_engines_counts() -> None:
    """``method: suffix`` at batch 1: rows finish in input order and the replayer learns each
    row after replaying it, so every row drafts from the same earlier rows in both, and the
    count at K=4 is each row's real one. A replayer that learned nothing counts less."""
    rows = random_prompts(6, 10, seed=2)
    torch.manual_seed(0)
    model = cycle_model(1, noise=0.1)
    eng = engine(model, 4, SUFFIX, {7})
    got = run(eng, rows)
    replayer = tree_replayer(eng, [0, 4])
    real = [r.spec.accepted if r.spec else 0 for r in got]
    assert [replayer.row(r)[1] for r in got] == real
    assert sum(tree_replayer(eng, [4]).row(r)[0] for r in got) < sum(real)


def test_suffix_replay_at_batch_4_reads_the_engines_index_as_each_row_did() -> None:
    """``method: suffix`` at batch 4 with rows of different lengths: rows finish out of input
    order and each drafts from the rows finished before its first draft, some of which
    finish after rows before it in the unit. Replayed in the unit's order against the
    engine's own indexes below each row's ``suffix_view``, the count at K=4 is every row's
    real one. A replayer with an index of its own, learning rows in the unit's order (the
    after-the-fact replay this replaced), misses some; one that pins no view (reads the
    whole index, the row's own output in it) counts more than the engine did."""
    gen = torch.Generator().manual_seed(4)
    lengths = torch.randint(6, 16, (12,), generator=gen).tolist()
    rows = [p[:n] for p, n in zip(random_prompts(12, 16, seed=7), lengths, strict=True)]
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    eng = engine(model, 4, SUFFIX, {7})
    got = run(eng, rows)
    real = [r.spec.accepted if r.spec else 0 for r in got]
    views = [r.suffix_view for r in got]
    assert sum(real) > 0 and None not in views
    exact = tree_replayer(eng, [4])
    exact.learner = eng.learner
    assert [exact.row(r)[0] for r in got] == real
    after = tree_replayer(eng, [4])
    assert [after.row(r)[0] for r in got] != real
    unpinned = tree_replayer(eng, [4])
    unpinned.learner = eng.learner
    for r in got:
        r.suffix_view = 1 << 40
    assert sum(unpinned.row(r)[0] for r in got) > sum(real)


def test_sampled_replay_at_another_k_is_an_unbiased_estimate() -> None:
    """Sampled rows at K=4 replayed at K=1, against real sampled rows at K=1 (other seeds):
    the mean accepted tokens per row agree within three standard errors of their
    difference. The replay is of a different run, so it can only agree in expectation."""
    rows = random_prompts(16, 10, seed=4)
    torch.manual_seed(1)
    model = cycle_model(4, noise=0.1)
    sampling = {"temperature": 1.0}
    at4 = run(engine(model, 4, NGRAM, **sampling), rows, list(range(16)))
    at1 = run(engine(model, 1, NGRAM, **sampling), rows, list(range(100, 116)))
    replayer = tree_replayer(engine(model, 4, NGRAM, **sampling), [1])
    replayed = np.array([replayer.row(r)[0] for r in at4], dtype=float)
    real = np.array([r.spec.accepted if r.spec else 0 for r in at1], dtype=float)
    assert real.sum() > 0
    se = math.hypot(replayed.std(ddof=1), real.std(ddof=1)) / math.sqrt(len(rows))
    assert abs(replayed.mean() - real.mean()) <= 3 * se + 1e-9
