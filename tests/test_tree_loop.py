"""The tree engine's loop (``engines.tree.engine``) on small models of the test's own, about a
second a test: where a row ends when the tree accepts several tokens in one step, what the
counts then hold, sampling with every tensor on the model's device, and replaying a drafter
over finished rows.

Two models: a *cycle* model, whose weights make the next token a fixed function of the last
(tokens run round cycles of six), so that n-gram trees from a prompt that holds the cycle are
accepted four deep, and an end of row can be put inside an accepted path on purpose (with
louder random layers, trees are accepted in part, as real ones are); and a small random Llama
for sampling, with realistic logits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CPU_BIND_ENV, job_dict
from support.feeds import Watched, one_row_units

from batchspec.engines.base import ListSource
from batchspec.engines.tree.drafting import replay
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.hybrid import NgramFirst
from batchspec.engines.tree.load import Target, open_drafter
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.suffix import SuffixDrafter
from batchspec.engines.tree.weights import convert, llama_config, random_weights
from batchspec.spec import JobSpec
from batchspec.spec.tree import TREE
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

VOCAB, CYCLE, MAX_LEN = 36, 6, 128
NGRAM = {"num_speculative_tokens": 4, "adaptive": False, "tree": {"max_depth": 4}}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 4, "adaptive": False}
DRAFT["tree"] = {"max_depth": 3, "draft_layers": [0]}
NGRAM_FIRST = {**DRAFT, "tree": {**DRAFT["tree"], "ngram_first": True}}
SUFFIX = {**NGRAM, "method": "suffix"}
TINY = {
    "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": VOCAB,
    "max_position_embeddings": MAX_LEN, "initializer_range": 0.5,
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread


def nxt(token: int) -> int:
    """The cycle model's next token: round a cycle of six (0..5, 6..11, ...)."""
    return token - token % CYCLE + (token + 1) % CYCLE


class Letters:
    """A tokenizer double: token i reads ``<i>``, so a stop string names one token."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


def cycle_model(batch: int, noise: float = 0.002) -> TreeModel:
    """Embeddings one-hot, decoder layers nearly silent, and a head that maps token t to
    nxt(t) with a margin of ~55 logits: greedy decoding runs round the cycles."""
    cfg = llama_config({**TINY, "hidden_size": VOCAB, "intermediate_size": 2 * VOCAB,
                        "num_attention_heads": 2, "num_key_value_heads": 1,
                        "tie_word_embeddings": False, "initializer_range": noise})  # fmt: skip
    weights = random_weights(cfg, torch.float32, "cpu")
    weights["model.embed_tokens.weight"] = torch.eye(VOCAB)
    head = torch.zeros(VOCAB, VOCAB)
    head[[nxt(t) for t in range(VOCAB)], range(VOCAB)] = 10.0
    weights["lm_head.weight"] = head
    return TreeModel(cfg, convert(cfg, weights, torch.float32, "cpu"), "cpu", batch, MAX_LEN)


def engine(model: TreeModel, k: int, speculative: dict, eos: set[int] = frozenset(), **sampling):
    """A tree engine on ``model`` with this job's sampling and drafting, 4 slots."""
    spec = JobSpec.model_validate(
        job_dict(
            Path("unused"),
            model={"max_num_seqs": model.max_batch, "max_model_len": MAX_LEN - 8},
            speculative={"engine": "tree", **speculative},
            sampling={"max_tokens": 40, **sampling},
        )
    )
    return TreeEngine(spec, k, target=Target(model, Letters(), set(eos), MAX_LEN - 8))


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB, (n, length), generator=gen).tolist()


def cycle_prompts(n: int, length: int) -> list[list[int]]:
    """Row i walks cycle i (no two rows share a token) from a token of its own."""
    out = []
    for i in range(n):
        walk = [CYCLE * i + 2 * i % CYCLE]
        while len(walk) < length:
            walk.append(nxt(walk[-1]))
        out.append(walk)
    return out


def run(eng: TreeEngine, rows: list[list[int]], seeds: list[int | None] | None = None):
    unit = WorkUnit(0, "in.parquet", 0, len(rows), None, len(rows))
    seeds = seeds or [None] * len(rows)
    reqs = [
        RowRequest(i, i, None, {}, p, seed=s)
        for i, (p, s) in enumerate(zip(rows, seeds, strict=True))
    ]
    results: list[RowResult] = []
    for res in eng.run(ListSource([UnitRequests(unit, reqs)]), lambda: False):
        assert res.engine == TREE
        results.extend(res.results)
    eng.close()
    return sorted(results, key=lambda r: r.request.row)


def same_rows(a: list[RowResult], b: list[RowResult]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)


def counts(r: RowResult) -> tuple[Any, ...]:
    s = r.spec
    return (s.drafted, s.per_step_drafted, s.per_step_accepted) if s else (None, None, None)


def replayed(r: RowResult, eng_spec: JobSpec, model: TreeModel, k: int) -> tuple[Any, ...]:
    """The row's counts from its drafter driven over its prompt and output (``drafting.replay``)."""
    drafter = open_drafter(eng_spec, k, model)
    shape = eng_spec.speculative.tree
    got = replay(
        drafter, r.request.prompt_token_ids, r.token_ids, k, shape, eng_spec.sampling.max_tokens
    )
    return (sum(got.nodes), tuple(got.depth), tuple(got.accepted))


ENDS = {
    "eos": ({"eos": True}, "stop"),
    "stop string": ({"stop": True}, "stop"),
    "max_tokens": ({"max_tokens": 3}, "length"),
}


@pytest.mark.parametrize("end", list(ENDS))
def test_an_end_inside_an_accepted_path_ends_the_row_as_plain_decoding(end: str) -> None:
    """Four rows walk their cycles; the tree's first step accepts four tokens (output 1..4).
    The row ends at output token 2 (its EOS token, or a stop string naming it, or max_tokens
    3): plain decoding and the tree engine give the same tokens, text and finish reason, and
    the counts hold only the tokens before the end (the step is not a rejection)."""
    rows = cycle_prompts(4, 8)
    free = run(engine(cycle_model(4), 4, NGRAM), rows)
    assert all(
        r.spec and r.spec.per_step_accepted[0] == 4 for r in free
    )  # the first path is 4 deep
    ends = {r.token_ids[2] for r in free}
    assert all(r.token_ids[:2].count(r.token_ids[2]) == 0 for r in free)
    kind, reason = ENDS[end]
    eos = ends if "eos" in kind else set()
    sampling: dict[str, Any] = {"stop": [f"<{t}>" for t in sorted(ends)]} if "stop" in kind else {}
    if "max_tokens" in kind:
        sampling["max_tokens"] = kind["max_tokens"]
    plain = run(engine(cycle_model(4), 0, NGRAM, eos, **sampling), rows)
    tree = run(engine(cycle_model(4), 4, NGRAM, eos, **sampling), rows)
    same_rows(plain, tree)
    for t in tree:
        assert len(t.token_ids) == 3 and t.finish_reason == reason
        assert t.text == (
            "<{}><{}>".format(*t.token_ids[:2]) if "stop" in kind else Letters().decode(t.token_ids)
        )
        # One step, which drafted four nodes (two: all max_tokens leaves room for) and
        # accepted the two emitted after the first token.
        drafted = 2 if "max_tokens" in kind else 4
        s = t.spec
        assert s is not None and s.steps == 1 and s.drafted == drafted and s.accepted == 2
        assert s.histogram == (0, 0, 1, 0, 0)
        assert (s.per_step_drafted, s.per_step_accepted) == ((2,), (2,))


@pytest.mark.parametrize(
    "speculative", [NGRAM, DRAFT, NGRAM_FIRST], ids=["ngram", "draft_model", "ngram_first"]
)
def test_greedy_trees_are_plain_decoding_and_replay_gives_their_counts(speculative) -> None:
    """The cycle model with louder layers (trees accepted in part) on random prompts: K=4
    rows identical to K=0 rows, and each row's drafter, replayed over its prompt and output,
    counts what the engine counted step by step; rows that end on EOS (token 7) included."""
    rows = random_prompts(6, 10, seed=2)
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    plain = run(engine(model, 0, speculative, {7}), rows)
    eng = engine(model, 4, speculative, {7})
    spec = eng.spec
    tree = run(eng, rows)
    same_rows(plain, tree)
    accepted = sum(r.spec.accepted for r in tree if r.spec)
    assert 0 < accepted < sum(r.spec.drafted for r in tree if r.spec)
    assert {r.finish_reason for r in tree} == {"stop", "length"}
    for r in tree:
        assert counts(r) == replayed(r, spec, model, 4)
    if speculative is NGRAM_FIRST:  # both drafted: the trie where the output cycles
        assert isinstance(eng.drafter, NgramFirst) and min(eng.drafter.chosen) > 0, eng.drafter


class GeneratorSpy:
    """Records the device every ``torch.Generator`` is made for."""

    def __init__(self, real: type) -> None:
        self.real, self.devices = real, []

    def __call__(self, device: Any = None) -> torch.Generator:
        self.devices.append(device)
        return self.real(device=device) if device is not None else self.real()


@pytest.mark.parametrize(
    "speculative", [NGRAM, DRAFT, NGRAM_FIRST], ids=["ngram", "draft_model", "ngram_first"]
)
def test_sampling_keeps_every_tensor_on_the_models_device(speculative, monkeypatch) -> None:
    """Sampled trees (seeded rows and rows on the engine's generator) with the default device
    set to ``meta``, where a tensor made without naming the model's device lands and has no
    values: the rows come out as without it, and every generator names the model's device.
    On CUDA such a tensor would land on the CPU and meet the model's tensors there."""
    rows = random_prompts(5, 10, seed=3)
    seeds = [11, None, 12, None, 13]
    sampling = {"temperature": 0.8, "top_p": 0.9, "top_k": 20}
    torch.manual_seed(0)
    model = TreeModel.random(TINY, torch.float32, "cpu", 4, MAX_LEN)
    want = run(engine(model, 4, speculative, **sampling), rows, seeds)
    spy = GeneratorSpy(torch.Generator)
    monkeypatch.setattr(torch, "Generator", spy)
    eng = engine(model, 4, speculative, **sampling)
    torch.set_default_device("meta")
    try:
        got = run(eng, rows, seeds)
    finally:
        torch.set_default_device(None)
    same_rows(want, got)
    assert spy.devices == [model.device] * 4  # the engine's, then one per seeded row
    assert sum(r.spec.accepted for r in got if r.spec) > 0


def test_the_tree_engine_takes_a_thread_per_core_or_fewer_as_omp_num_threads_says() -> None:
    # More threads than cores made steps ~10x slower on a shared machine; OMP_NUM_THREADS
    # (set by a user, a scheduler, or the suite's in-process engines) may ask for fewer.
    code = """
import os, torch
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
from batchspec.engines.cpu_threads import bind_cpus
for omp in ("1", None, "8", "x"):
    os.environ.pop("OMP_NUM_THREADS", None)
    if omp is not None:
        os.environ["OMP_NUM_THREADS"] = omp
    bind_cpus()
    print(torch.get_num_threads(), end=" ")
print(len(os.sched_getaffinity(0)))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", CPU_BIND_ENV)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    *threads, cores = map(int, out.stdout.split())
    assert threads == [1, cores, cores, cores], out.stderr


def test_suffix_trees_are_plain_decoding_and_replay_against_earlier_rows_gives_their_counts():
    """``method: suffix`` at batch 1 (each row drafts from the rows finished before it): rows
    identical to K=0's, more accepted than the row's own n-gram trie alone (the rows share
    the model's cycles), and each row replayed against a drafter that learned the rows before
    it counts what the engine counted step by step."""
    rows = random_prompts(6, 10, seed=2)
    torch.manual_seed(0)
    model = cycle_model(1, noise=0.1)
    plain = run(engine(model, 0, SUFFIX, {7}), rows)
    eng = engine(model, 4, SUFFIX, {7})
    tree = run(eng, rows)
    same_rows(plain, tree)
    alone = run(engine(model, 4, NGRAM, {7}), rows)
    assert sum(r.spec.accepted for r in tree) > sum(r.spec.accepted for r in alone)
    drafter = open_drafter(eng.spec, 4, model)
    assert isinstance(drafter, SuffixDrafter)
    for r in tree:
        got = replay(
            drafter, r.request.prompt_token_ids, r.token_ids, 4, eng.spec.speculative.tree, 40
        )
        assert counts(r) == (sum(got.nodes), tuple(got.depth), tuple(got.accepted))
        drafter.learn(r.request.domain, r.token_ids)


def test_a_finished_unit_is_handed_over_before_the_next_is_taken() -> None:
    """The next unit's K is chosen knowing the units that just finished (a domain's first
    unit tells every K by replay): one slot, three one-row units, each taken only after the
    one before it reached the consumer. Taking before handing over gives [0, 0, 1]."""
    eng = engine(cycle_model(1), 2, NGRAM)
    got: list[Any] = []
    source = Watched(one_row_units(cycle_prompts(3, 8)), got)
    for res in eng.run(source, lambda: False):
        got.append(res)
    eng.close()
    assert len(got) == 3 and source.held_at_take == [0, 1, 2]
