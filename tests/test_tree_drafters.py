"""Several drafters in one tree engine (``speculative.drafters``, ``engines/tree/multi.py``):
units drafting with n-gram trees, suffix trees and a draft model decode together in one batch,
each with its own drafter, and stay plain decoding's tokens; each unit records its drafter,
each row's counts are its own drafter's replayed; a prompt is copied only from a twin of the
same drafter; a draft model with and without n-gram trees first is one model. Small
in-process models of ``test_tree_loop`` (a few seconds)."""

from __future__ import annotations

import pytest
import torch
from test_tree_kmix import by_row, run_units
from test_tree_loop import counts, cycle_model, engine, random_prompts

from batchspec.engines.tree.drafting import replay
from batchspec.engines.tree.multi import DraftCosts, DrafterSet
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.units import RowRequest, UnitRequests, WorkUnit

pytestmark = pytest.mark.usefixtures("one_thread")

MULTI = {
    "method": "ngram",
    "drafters": ["ngram", "suffix", "draft_model", "draft_model+ngram"],
    "num_speculative_tokens": 4,
    "tree": {"max_depth": 3, "draft_layers": [0]},
}


def units(prompts: list[list[int]], plans: list[tuple[int, str | None]]) -> list[UnitRequests]:
    """One unit per (K, drafter) of ``plans``, the prompts dealt out to them in turn."""
    out = []
    for u, (k, drafter) in enumerate(plans):
        rows = [RowRequest(i, i, "d", {}, p) for i, p in enumerate(prompts) if i % len(plans) == u]
        unit = WorkUnit(u, "in.parquet", u * 100, u * 100 + len(rows), "d", len(rows))
        out.append(UnitRequests(unit, rows, k=k, drafter=drafter))
    return out


def test_units_with_different_drafters_decode_together_as_plain_decoding() -> None:
    prompts = random_prompts(12, 10, seed=7)
    prompts[1] = prompts[0]  # one prompt in two units of two drafters: no copy across them
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    plain = by_row(run_units(engine(model, 0, MULTI, {7}), units(prompts, [(0, None)])))
    eng = engine(model, 4, MULTI, {7})
    assert isinstance(eng.drafter, DrafterSet) and eng.draft_costs is eng.drafter.costs
    plans = [(4, "ngram"), (4, "suffix"), (4, "draft_model"), (4, "draft_model+ngram")]
    plans.append((0, "suffix"))
    done = run_units(eng, units(prompts, plans))
    assert [(d.k, d.method) for d in done] == [
        (4, "ngram-tree"), (4, "suffix-tree"), (4, "draft_model-tree"),
        (4, "draft_model+ngram-tree"), (0, "none"),
    ]  # fmt: skip
    got = by_row(done)
    assert {i: r.token_ids for i, r in got.items()} == {i: r.token_ids for i, r in plain.items()}
    assert eng.shared_prefills == 0  # rows 0 and 1 share a prompt, not a drafter
    s = eng.spec.speculative
    for r in done[0].results:  # the n-gram unit's counts are n-gram trees' replayed
        drafter = NgramDrafter(s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
        room = eng.spec.sampling.max_tokens
        again = replay(drafter, r.request.prompt_token_ids, r.token_ids, 4, s.tree, room)
        assert counts(r)[1:] == (tuple(again.depth), tuple(again.accepted))
    assert sum(r.spec.accepted for r in got.values() if r.spec) > 0
    measured = eng.draft_costs.summary()
    assert set(measured) == {"ngram", "suffix", "draft_model", "draft_model+ngram"}
    loaded = eng.drafter.drafters  # the draft model loaded once, for both of its entries
    assert loaded["draft_model+ngram"].model is loaded["draft_model"]  # type: ignore[attr-defined]
    assert measured["draft_model"] > measured["ngram"]  # a forward per depth, against a trie


def test_a_unit_asking_for_a_drafter_not_loaded_is_refused() -> None:
    eng = engine(cycle_model(4), 4, {**MULTI, "drafters": ["ngram", "suffix"], "tree": {}})
    with pytest.raises(Exception, match="drafter eagle3 is not loaded"):
        run_units(eng, units(random_prompts(2, 6, seed=1), [(4, "eagle3")]))


def test_draft_costs_take_the_engines_own_once_it_has_enough() -> None:
    costs = DraftCosts()
    assert costs.per_row("ngram") is None
    costs.add("ngram", 0.02, 10, replayed=True)
    costs.add("ngram", 0.5, 5)
    assert costs.per_row("ngram") == pytest.approx(0.002)  # 5 engine steps: the replay's
    costs.add("ngram", 0.5, 15)
    assert costs.per_row("ngram") == pytest.approx(0.05)  # 20: the engine's own
