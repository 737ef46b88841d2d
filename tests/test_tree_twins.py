"""Rows of one prompt in flight together on the tree engine ("twins": a prompt's n samples, or
one prompt in units at different K), and what each tree must start from.

A row whose prompt a row in flight already has copies that row's cached prompt instead of
computing it. What the copy must not lose: an EAGLE-3 head needs the target's features of every
prompt position, which only a computed prefill keeps, so a drafting row cannot copy from a twin
at K=0 (the crash an audit found: "slot 1: 7 positions' features wanted, None kept"); and each
sample must keep its own seed, since the copy is of the prompt, not of the sampler. Every tree
the engine verifies must hang under the row's root (its last chosen token): a drafter that gets
that wrong would make the engine emit tokens plain decoding never would, so it is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_distill import MAX_LEN, VOCAB, Letters, job, random_head, tiny

from batchspec.engines.base import EngineFailure, ListSource
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.load import Target
from batchspec.engines.tree.shape import DraftTree
from batchspec.measure.distill_train import draft_vocab
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread

PROMPT = [3, 7, 11, 2, 9, 3, 7]


def eagle_engine(tmp: Path) -> TreeEngine:
    """A tree engine drafting with a random EAGLE-3 head (saved and loaded as a job's head)."""
    head = random_head(tiny(), draft_vocab([PROMPT], 0, VOCAB))
    head.save(tmp / "head", "tiny", 4)
    spec = job(tmp, {"method": "eagle3", "model": str(tmp / "head"),
                     "num_speculative_tokens": 4, "adaptive": False,
                     "tree": {"max_depth": 3}})  # fmt: skip
    return TreeEngine(spec, 4, target=Target(tiny(), Letters(), set(), MAX_LEN - 16))


def units_at(ks: list[int], prompt: list[int]) -> list[UnitRequests]:
    """One single-row unit per K, all of the same prompt."""
    out = []
    for u, k in enumerate(ks):
        unit = WorkUnit(u, "in.parquet", u, u + 1, None, 1)
        out.append(UnitRequests(unit, [RowRequest(u, u, None, {}, list(prompt))], k=k))
    return out


def tokens(eng: TreeEngine, todo: list[UnitRequests]) -> list[list[int]]:
    done = [r for res in eng.run(ListSource(todo), lambda: False) for r in res.results]
    return [r.token_ids for r in sorted(done, key=lambda r: r.request.row)]


@pytest.mark.parametrize(
    ("ks", "shared"), [([0, 4], 0), ([4, 0], 1), ([4, 4], 1)], ids=["k0-first", "k4-first", "both"]
)
def test_an_eagle_row_never_copies_a_prompt_whose_features_were_not_kept(
    tmp_path: Path, ks: list[int], shared: int
) -> None:
    """A K=0 row in flight and a K=4 row of the same prompt starting: the K=4 row computes its
    prompt (its head needs the features), where before it copied the K=0 row's cache and the
    drafter failed; a K=0 row copies a drafting twin's, and two drafting twins share one
    prefill. Greedy: every row is plain decoding's."""
    eng = eagle_engine(tmp_path)
    plain = tokens(eng, units_at([0], PROMPT))[0]
    eng.shared_prefills = 0
    assert tokens(eng, units_at(ks, PROMPT)) == [plain, plain]
    assert eng.shared_prefills == shared


class WrongRoot:
    """A drafter double whose trees hang under a token that is not the row's root."""

    def start(self, slot: int, prompt: list[int], twin: int | None = None) -> None:
        self.last = prompt[-1]

    def extend(self, slot: int, tokens: list[int]) -> None:
        self.last = tokens[-1]

    def draft(self, asks: list) -> list[DraftTree]:
        return [DraftTree([(self.last + 1) % VOCAB, 5], [-1, 0]) for _ in asks]

    def release(self, slot: int) -> None:
        return None


def test_a_tree_not_rooted_at_the_rows_root_is_refused(tmp_path: Path) -> None:
    """The root of every verified tree is the row's last chosen token; a drafter's tree rooted
    elsewhere stops the engine with the slot and both tokens named, not a wrong row."""
    spec = job(tmp_path, {"num_speculative_tokens": 4, "adaptive": False})
    eng = TreeEngine(spec, 4, target=Target(tiny(), Letters(), set(), MAX_LEN - 16))
    eng.drafter = WrongRoot()
    with pytest.raises(EngineFailure, match=r"slot 0: the drafter's tree is rooted at token \d+"):
        tokens(eng, units_at([4], PROMPT))


def sampled_rows(eng: TreeEngine, seeds: list[int], share: bool) -> list[RowResult]:
    """One row per seed, of one prompt, in one unit (``share``: in flight together) or each
    alone in a unit of its own after the last finished."""
    reqs = [
        RowRequest(i, i, None, {}, list(PROMPT), seed=s, sample_index=i)
        for i, s in enumerate(seeds)
    ]
    groups = [reqs] if share else [[r] for r in reqs]
    out = []
    for group in groups:
        unit = WorkUnit(0, "in.parquet", 0, len(group), None, len(group))
        for res in eng.run(ListSource([UnitRequests(unit, group)]), lambda: False):
            out.extend(res.results)
    return sorted(out, key=lambda r: r.request.row)


def test_each_sample_of_a_shared_prefill_draws_with_its_own_seed(tmp_path: Path) -> None:
    """A prompt's three samples sharing one prefill give, token for token, what each gives
    decoding alone with its seed (float32, n-gram trees at K=4, temperature 1): the copy is of
    the prompt's cache, never of a sampler. With every sample on the first one's seed, samples
    1 and 2 would repeat sample 0."""
    spec = job(tmp_path, {"num_speculative_tokens": 4, "adaptive": False})
    spec = spec.model_copy(
        update={"sampling": spec.sampling.model_copy(update={"temperature": 1.0})}
    )
    eng = TreeEngine(spec, 4, target=Target(tiny(), Letters(), set(), MAX_LEN - 16))
    seeds = [11, 12, 13]
    together = sampled_rows(eng, seeds, share=True)
    assert eng.shared_prefills == 2
    alone = sampled_rows(eng, seeds, share=False)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert len({tuple(r.token_ids) for r in alone}) == 3
