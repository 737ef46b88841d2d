"""The tree engine's K priced at the nodes its trees hold (``engines/tree/drafted.py``, issue
35): at batch 1 a step costs the row's own nodes, so a domain whose n-gram trees hold 2 nodes
at K=8 pays for 2, not 8, and speculates where a domain whose trees fill K does not; at batch
B the widest tree's bound; cells the run's steps replaced between node counts price it; and
``report`` prices K as the run did and shows the nodes. No engine: a synthetic profile through
the real policy and controller."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import job_dict

from batchspec.engines.tree.drafted import widest_nodes
from batchspec.engines.tree.profile import StepProfile
from batchspec.engines.tree.step_check import MIN_STEPS
from batchspec.io.layout import OutDir
from batchspec.observe.report import controller_view
from batchspec.observe.step_view import format_step_fit
from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import KPolicy
from batchspec.speculation.steps import read_fill_cost

GRID = [0, 2, 8]
NODES = [0.010, 0.0119, 0.0299]
"""A verify forward at 0, 2 and 8 draft nodes: 8 full nodes cost 2.5x what 2 do."""
DRAFTING = 0.0001
"""Seconds of n-gram drafting per row and step (measured by the engine: ``DraftCosts``)."""
PER_STEP = {0: 1.0, 2: 1.3, 8: 1.6}
"""Replayed tokens per decode step at each K, alike in both domains."""


def policy(
    tmp_path: Path, batch: int, profile: StepProfile, drafters: list[str] | None = None
) -> KPolicy:
    """The real K policy of an adaptive n-gram tree job at ``batch`` (with ``drafters``, a
    drafter per domain too), its engine up with ``profile`` and its measured drafting
    (``KPolicy.engine_up``)."""
    speculative = {"engine": "tree", "method": "ngram", "k_grid": GRID, "drafters": drafters}
    speculative |= {"num_speculative_tokens": 2, "tree": {"max_depth": 8}}
    job = job_dict(tmp_path / "out", model={"max_num_seqs": batch}, speculative=speculative)
    p = KPolicy(JobSpec.model_validate(job), OutDir(tmp_path / "out"), "w")
    costs = SimpleNamespace(per_row=lambda d: DRAFTING, summary=lambda: {"ngram": DRAFTING})
    p.engine_up(SimpleNamespace(k_per_unit=True, step_profile=profile, draft_costs=costs))
    return p


def unit(domain: str, batch: int, nodes: dict[int, float] | None) -> Observation:
    """A unit of 10 rows of 1,001 tokens at K=0 (100 tok/s: a plain step of 10 ms), replayed
    at every K to ``PER_STEP``, its trees holding ``nodes`` draft nodes a decode step on
    average (None: not counted, as in replays of older runs)."""
    ob = Observation(domain, 0, batch, rows=10, output_tokens=10010, running_s=100.1)
    ob.add_replay(replayed(nodes))
    return ob


def replayed(nodes: dict[int, float] | None) -> list[list[float]]:
    """The replay of ``unit``'s rows: ``[K, tokens, accepted, drafted nodes]`` per K."""
    items = []
    for k, per_step in PER_STEP.items():
        steps = 10000 / per_step
        drafted = [] if nodes is None else [nodes.get(k, 0.0) * steps]
        items.append([k, 10000, 10000 - steps, *drafted])
    return items


DENSE = {2: 2.0, 8: 8.0}
"""Trees that fill every K."""
SPARSE = {2: 1.5, 8: 2.0}
"""Trees of a trie with few continuations: 1.5 nodes at K=2, 2 at K=8."""


def test_a_domain_whose_trees_hold_few_nodes_is_priced_at_them(tmp_path: Path) -> None:
    """At batch 1, same replayed tokens per step in both domains (1.3 at K=2, 1.6 at K=8). A
    step costs 10 ms plain, 12 at 2 nodes, 30 at 8 (drafting included). "dense" fills K:
    K=2 pays 1.3/12 against 1/10, K=8 1.6/30 does not: K=2. "sparse"'s trees hold 2 nodes at
    K=8, whose step costs 12 ms: 1.6/12 beats its K=2 (1.5 nodes, 11.5 ms): K=8. Priced at
    the full K (replays without the node count), sparse's K=8 costs 30 ms as dense's does,
    and both take K=2."""
    profile = StepProfile([1], [0, 2, 8], [NODES])
    p = policy(tmp_path, 1, profile)
    p.observe(unit("dense", 1, DENSE))
    p.observe(unit("sparse", 1, SPARSE))
    assert p.decide({"dense": 10, "sparse": 10}, 2).plan == {"dense": 2, "sparse": 8}
    sparse, dense = p.ctl.choose("sparse").rates, p.ctl.choose("dense").rates
    half = NODES[0] + (NODES[1] - NODES[0]) * 0.75  # 1.5 nodes, between 0 and 2
    assert sparse[0] == pytest.approx(1.0 / 0.010)
    assert sparse[2] == pytest.approx(1.3 / (half + DRAFTING))
    assert sparse[8] == pytest.approx(1.6 / 0.012)
    assert dense[8] == pytest.approx(1.6 / 0.030)
    # The price of a full tree is the step's price, whatever the fill: one rule, two uses.
    for k in GRID:
        assert p.ctl.fill_cost(k, 1.0) == pytest.approx(p.ctl.step_cost(k))

    older = policy(tmp_path / "older", 1, StepProfile([1], [0, 2, 8], [NODES]))
    older.observe(unit("dense", 1, None))
    older.observe(unit("sparse", 1, None))
    assert older.decide({"dense": 10, "sparse": 10}, 2).plan == {"dense": 2, "sparse": 2}
    assert older.ctl.choose("sparse").rates[8] == pytest.approx(1.6 / 0.030)


def test_each_drafter_is_priced_at_the_nodes_its_own_trees_hold(tmp_path: Path) -> None:
    """With ``speculative.drafters``, every drafter's replay carries its own nodes
    (``Observation.replays``): n-gram trees that fill K and suffix trees that hold 2 nodes
    at K=8, alike in tokens per step. Priced at its nodes, suffix at K=8 wins (1.6 tokens in
    12 ms); at the full K both drafters' K=2 tie and the one listed first, n-gram, would be
    taken."""
    p = policy(tmp_path, 1, StepProfile([1], [0, 2, 8], [NODES]), ["ngram", "suffix"])
    ob = unit("d", 1, DENSE)
    ob.drafter, ob.replays = "ngram", {"ngram": replayed(DENSE), "suffix": replayed(SPARSE)}
    p.observe(ob)
    decision = p.decide({"d": 10}, 2)
    assert (decision.plan, decision.drafters) == ({"d": 8}, {"d": "suffix"})
    assert p.drafters is not None
    assert p.drafters.choose("d").rate == pytest.approx(1.6 / 0.012)


def test_at_batch_b_a_padded_step_is_priced_at_the_widest_trees_bound() -> None:
    """A step of B rows costs its widest tree; with a mean of fill·K nodes a row, the widest
    of B is at most K·(1 − (1 − fill)^B) (trees of K nodes or none): the mean at batch 1,
    K at full fill, near K for a large batch of sparse rows."""
    assert widest_nodes(8, 0.25, 1) == pytest.approx(2.0)
    assert widest_nodes(8, 0.25, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert widest_nodes(8, 1.0, 8) == pytest.approx(8.0)
    assert widest_nodes(8, 0.0, 8) == 0.0
    profile = StepProfile([1, 8], [0, 2, 8], [NODES, [2 * s for s in NODES]])
    widest = 8 * (1 - 0.75**8)
    at = 2 * (NODES[1] + (NODES[2] - NODES[1]) * (widest - 2) / 6)
    assert profile.seconds_at(8, 8, 0.25) == pytest.approx(at)
    assert profile.seconds_at(1, 8, 0.25) == pytest.approx(NODES[1])
    # Packed forwards (``packing``: the CPU's) cost their trees' nodes: the mean at any batch.
    profile.packed = True
    assert profile.seconds_at(8, 8, 0.25) == pytest.approx(2 * NODES[1])
    assert profile.summary(8, [0, 8])["packed"]


def test_a_cell_the_runs_steps_replaced_prices_the_trees_that_size(tmp_path: Path) -> None:
    """The run's steps of 4-node trees take 2.5x what the profile interpolates there, plain
    steps what it says: ``step_check`` replaces both cells (the pool's ratio, 1.75, fits
    neither). A domain whose trees hold 4 nodes at K=8 is priced at 4-node steps' own mean,
    not at the profile's line between 2 and 8 nodes."""
    profile = StepProfile([1], [0, 2, 8], [NODES])
    four = profile.forward_seconds(1, 4)
    for _ in range(MIN_STEPS):
        profile.observe(1, 0, NODES[0])
        profile.observe(1, 4, 2.5 * four)
    assert profile.check.replaced == {(1, 0), (1, 4)}
    assert profile.priced_nodes(1) == [0, 2, 4, 8]
    assert profile.seconds_at(1, 8, 0.5) == pytest.approx(2.5 * four)
    assert profile.seconds_at(1, 2, 0.5) == pytest.approx((NODES[0] + profile.seconds(1, 2)) / 2)


def test_report_prices_tree_k_at_the_nodes_as_the_run_did(tmp_path: Path) -> None:
    """``report`` reads the prices by node count from the worker's step file: each domain's
    K priced at its own nodes as the worker priced it, the same choices, and the nodes the
    replayed trees held (both domains pooled: 1.75 at K=2, 5 at K=8) beside the forward a step
    of them is priced at (5 nodes: 20.9 ms)."""
    p = policy(tmp_path, 1, StepProfile([1], [0, 2, 8], [NODES]))
    p.observe(unit("dense", 1, DENSE))
    p.observe(unit("sparse", 1, SPARSE))
    out = OutDir(tmp_path / "out")
    fill = read_fill_cost(out, "tree", 1)
    assert fill is not None
    for k in GRID:
        for f in (0.0, 0.25, 0.75, 1.0):
            assert fill(k, f) == pytest.approx(p.ctl.fill_cost(k, f))
    view = controller_view(out)
    assert view is not None and {d: v.k for d, v in view[1].items()} == {"dense": 2, "sparse": 8}
    last = format_step_fit(out).splitlines()[-1]
    assert last.startswith("  replayed trees held, nodes a decode step (every domain pooled)")
    assert last.endswith("K=2 1.75 (88%), 11.7 ms, K=8 5.00 (62%), 20.9 ms")
