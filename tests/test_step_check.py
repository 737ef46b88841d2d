"""The tree engine's step profile checked against the run's own steps (``engines.tree.step_check``,
issue 35): a cached profile off by 2x is corrected after ``MIN_STEPS`` steps and the real K
controller then chooses another K; a profile within noise is left alone; a machine slower
everywhere rescales every cell; ``report`` shows measured against profiled. No engine:
synthetic profiles and step timings."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from batchspec.engines.tree.profile import StepProfile
from batchspec.engines.tree.step_check import MIN_STEPS
from batchspec.io.layout import OutDir
from batchspec.observe.step_view import format_step_fit
from batchspec.speculation.controller import Controller
from batchspec.speculation.estimator import Observation
from batchspec.speculation.steps import write_step_costs


def profiled() -> StepProfile:
    """A cached profile: at 8 rows a plain step 20 ms, a 4-node verify 60 ms."""
    return StepProfile([1, 8], [0, 4], [[0.005, 0.010], [0.020, 0.060]])


def unit() -> Observation:
    """A unit of 20 rows of 101 tokens at K=0, batch 8, 50 tok/s a row, replayed at K=4 to
    1.8 tokens per decode step (1,800 tokens, 800 of them accepted drafts)."""
    ob = Observation("d", 0, 8, rows=20, output_tokens=2020, running_s=40.4, engine="tree")
    ob.rated, ob.rate_sum, ob.rate_sq = 20, 1000.0, 20 * 50.0**2 + 0.5
    ob.add_replay([[0, 1800, 0], [4, 1800, 800]])
    return ob


def controller(profile: StepProfile) -> Controller:
    """The real controller, pricing K by ``profile`` as ``KPolicy.engine_up`` sets it."""
    ctl = Controller(8, [0, 4], default_k=4, step_cost=lambda k: profile.seconds(8, k))
    ctl.add(unit())
    return ctl


def feed(profile: StepProfile, truth: dict[tuple[int, int], float], steps: int) -> list:
    """``steps`` real steps of every cell of ``truth`` in turn, each its true seconds
    jittered by up to 5 %; returns them as (cell, seconds)."""
    rng = random.Random(0)
    fed = []
    for _ in range(steps):
        for cell, seconds in truth.items():
            s = seconds * rng.uniform(0.95, 1.05)
            profile.observe(*cell, s)
            fed.append((cell, s))
    return fed


def mean(fed: list, cell: tuple[int, int]) -> float:
    times = [s for c, s in fed if c == cell]
    return sum(times) / len(times)


def test_a_profile_off_by_2x_is_corrected_and_the_controller_changes_k() -> None:
    """The profile says a 4-node verify costs 3x a plain step (60 against 20 ms); this
    machine now does it in 30 ms. K=4 gives 1.8 tokens a step, so it pays where it costs
    under 1.8x a plain step: priced from the cache the controller runs K=0, priced from the
    run's own steps K=4. Before ``MIN_STEPS`` steps of a cell nothing is replaced (the pool's
    ratio rescales both alike, which leaves the choice as it was)."""
    profile = profiled()
    ctl = controller(profile)
    assert ctl.choose("d").k == 0
    truth = {(8, 0): 0.020, (8, 4): 0.030}
    fed = feed(profile, truth, MIN_STEPS - 1)
    assert profile.check.replaced == set()
    scale = profile.check.pool.mean_ratio()
    assert scale == pytest.approx(0.75, abs=0.02) and profile.check.scale == scale
    assert profile.seconds(8, 4) == pytest.approx(0.060 * scale)
    ctl.add(unit())  # the next unit commits: predictions are made again
    assert ctl.choose("d").k == 0

    fed += feed(profile, truth, 1)
    assert profile.check.replaced == {(8, 0), (8, 4)}
    assert profile.seconds(8, 0) == pytest.approx(mean(fed, (8, 0)))
    assert profile.seconds(8, 4) == pytest.approx(mean(fed, (8, 4)))
    assert profile.forward_seconds(8, 4) == 0.060  # the cached table itself is kept
    ctl.add(unit())
    assert ctl.choose("d").k == 4


def test_a_profile_within_noise_is_left_alone() -> None:
    """Steps that scatter 5 % either side of every cell move no price, however many."""
    profile = profiled()
    ctl = controller(profile)
    feed(profile, {(8, 0): 0.020, (8, 4): 0.060, (1, 0): 0.005, (1, 4): 0.010}, 100)
    assert profile.check.scale == 1.0 and profile.check.replaced == set()
    for cell in [(8, 0), (8, 4), (1, 0), (1, 4), (8, 2), (4, 1)]:
        assert profile.seconds(*cell) == profile.forward_seconds(*cell)
    ctl.add(unit())
    assert ctl.choose("d").k == 0


def test_a_machine_slower_everywhere_rescales_every_cell_unseen_ones_too() -> None:
    """Every step 1.5x its cell: the profile is scaled, cells that agree with the scaled
    profile keep its shape, and a cell no step ran (2 nodes) is priced 1.5x too."""
    profile = profiled()
    feed(profile, {(8, 0): 0.030, (8, 4): 0.090}, 2 * MIN_STEPS)
    scale = profile.check.scale
    assert scale == pytest.approx(1.5, abs=0.02) and profile.check.replaced == set()
    assert profile.seconds(8, 2) == pytest.approx(1.5 * profile.forward_seconds(8, 2), rel=0.02)


def test_report_shows_measured_against_profiled(tmp_path: Path) -> None:
    """The worker writes the check with its step costs; ``report`` prints each judged cell
    and every K's price beside its profiled forward."""
    profile = profiled()
    feed(profile, {(8, 0): 0.020, (8, 4): 0.030}, MIN_STEPS)
    out = OutDir(tmp_path / "out")
    priced = {k: profile.seconds(8, k) for k in (0, 4)}
    write_step_costs(out, "w1", "tree", 8, priced, profile.summary(8, [0, 4]))
    lines = format_step_fit(out).splitlines()
    assert lines[0].startswith(f"tree step profile, checked against {2 * MIN_STEPS} steps")
    assert "profile scaled x0.7" in lines[0]
    assert lines[2].startswith(f"  8 rows, 4 nodes: {MIN_STEPS} steps, measured 30.")
    assert lines[2].endswith("profiled 60.0 ms: priced as measured")
    assert lines[3].startswith("  a step of 8 rows, ms: K=0 20.") and "(profiled 60.0)" in lines[3]


def test_packed_steps_count_above_their_mean_and_correct_it_by_their_ratio() -> None:
    """Packed steps (one row's 4-node tree among seven plain rows: a mean of 0.5 nodes) that
    take 1.5x what the profile interpolates there count in the 1-node cell, the one above
    (never in the plain cell, which holds plain steps alone), and replace it at the profile
    times their mean ratio: 45 ms at 1 node, not their own 37.5 ms mean; a price between 0
    and 4 nodes passes through it."""
    profile = profiled()
    profile.packed = True
    assert profile.forward_seconds(8, 0.5) == pytest.approx(0.025)
    for _ in range(MIN_STEPS):
        profile.observe_step([4, 0, 0, 0, 0, 0, 0, 0], 1.5 * 0.025)
        profile.observe_step([0] * 8, 0.020)
    cells = profile.check.cells
    assert cells[(8, 0)].steps == cells[(8, 1)].steps == MIN_STEPS
    assert (8, 1) in profile.check.replaced  # (the plain cell too: the pool rescaled)
    assert profile.seconds(8, 0) == pytest.approx(0.020)
    assert profile.seconds(8, 1) == pytest.approx(1.5 * 0.030)
    assert profile.seconds_at(8, 4, 0.125) == pytest.approx(0.020 + 0.5 * 0.025)
    # Padded (a GPU's graphs), the same step costs its widest tree: the 4-node cell.
    padded = profiled()
    padded.observe_step([4, 0, 0, 0, 0, 0, 0, 0], 0.060)
    assert list(padded.check.cells) == [(8, 4)]
