"""K per unit on the tree engine (``UnitRequests.k``): rows of units at different K decode
together in one batch of one engine, each at its own K, and stay plain decoding's tokens.

Small in-process models of ``test_tree_loop`` (a second a test)."""

from __future__ import annotations

import pytest
import torch
from test_tree_loop import (
    DRAFT,
    NGRAM,
    counts,
    cycle_model,
    engine,
    random_prompts,
    replayed,
)

from batchspec.engines.base import ListSource
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.load import max_k
from batchspec.engines.tree.shape import DraftTree
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit

pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread


def units(prompts: list[list[int]], ks: list[int | None]) -> list[UnitRequests]:
    """One unit per K in ``ks``, the prompts dealt out to them in turn."""
    out = []
    for u, k in enumerate(ks):
        rows = [RowRequest(i, i, None, {}, p) for i, p in enumerate(prompts) if i % len(ks) == u]
        unit = WorkUnit(u, "in.parquet", u * 100, u * 100 + len(rows), None, len(rows))
        out.append(UnitRequests(unit, rows, k=k))
    return out


def run_units(eng: TreeEngine, todo: list[UnitRequests]) -> list[UnitResult]:
    done = list(eng.run(ListSource(todo), lambda: False))
    eng.close()
    return done


def by_row(done: list[UnitResult]) -> dict[int, RowResult]:
    return {r.request.row: r for res in done for r in res.results}


class Widths:
    """Records each step's tree sizes (root included), row by row."""

    def __init__(self, eng: TreeEngine) -> None:
        self.trees, self.sizes = eng._trees, []
        eng._trees = self  # type: ignore[method-assign]

    def __call__(self) -> list[DraftTree]:
        trees = self.trees()
        self.sizes.append([t.size for t in trees])
        return trees


@pytest.mark.parametrize(
    ("speculative", "built"), [(NGRAM, 0), (DRAFT, 4)], ids=["ngram-built-0", "draft_model-built-4"]
)
def test_units_at_different_k_decode_together_as_plain_decoding(speculative, built) -> None:
    """Twelve rows in units at K=0, 4, 2 and the engine's own (None) go through 4 slots of one
    engine, built at K=0 or 4: every row's tokens are K=0's, each unit reports its K and
    method, a K=0 row has no speculative counts, and a K>0 row counts what its drafter
    replayed at that K counts; forwards mixed rows drafting and rows alone at their root."""
    prompts = random_prompts(12, 10, seed=5)
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    plain = by_row(run_units(engine(model, 0, speculative, {7}), units(prompts, [None])))
    eng = engine(model, built, speculative, {7})
    widths = Widths(eng)
    done = run_units(eng, units(prompts, [0, 4, 2, None]))
    method = f"{eng.spec.speculative.method}-tree"
    assert [(d.k, d.method) for d in done] == [
        (k, "none" if k == 0 else method) for k in (0, 4, 2, built)
    ]
    got = by_row(done)
    assert {i: r.token_ids for i, r in got.items()} == {i: r.token_ids for i, r in plain.items()}
    for d in done:
        for r in d.results:
            if d.k == 0:
                assert r.spec is None
            else:
                assert r.spec is not None and len(r.spec.histogram) <= d.k + 1
                assert counts(r) == replayed(r, eng.spec, model, d.k)
    assert sum(r.spec.accepted for r in got.values() if r.spec) > 0
    assert any(1 in sizes and max(sizes) > 1 for sizes in widths.sizes)


def test_a_unit_beyond_the_engines_room_is_refused() -> None:
    """The cache holds trees of at most ``k_cap`` nodes behind the longest row: a unit asking
    for more is an error, not a silent smaller K."""
    eng = engine(cycle_model(4), 0, NGRAM)
    with pytest.raises(ValueError, match=f"K={eng.k_cap + 1}; this engine takes 0 to"):
        run_units(eng, units(random_prompts(2, 6, seed=1), [eng.k_cap + 1]))


def test_the_engine_is_sized_for_every_k_the_job_may_ask() -> None:
    spec = engine(cycle_model(1), 0, {**NGRAM, "k_grid": [0, 2, 6], "per_domain": {"a": 7}}).spec
    assert max_k(spec, 3) == 7
    assert max_k(spec.model_copy(update={"speculative": spec.speculative.model_copy(
        update={"method": "none"})}), 0) == 0  # fmt: skip
