"""The tree engine's step profile (``engines.tree.profile``): measured once per machine, model,
dtype, device and thread count, cached, loaded by later builds, checked against real steps.

A small random Llama of ``test_tree_loop`` in process, the cache in the test's directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_tree_kmix import run_units, units
from test_tree_loop import NGRAM, TINY, engine, random_prompts

from batchspec.engines.tree import profile
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.profile import StepProfile, profile_key

pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread

MAX_LEN = 128


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BATCHSPEC_CACHE", str(tmp_path))
    return tmp_path / "profiles"


class Counted:
    """``profile.measure_cell``, counting the cells it measures."""

    def __init__(self) -> None:
        self.real, self.cells = profile.measure_cell, []

    def __call__(self, model, slots, nodes, repeats) -> float:
        self.cells.append((len(slots), nodes))
        return self.real(model, slots, nodes, 1)


def test_the_first_build_measures_later_builds_load_and_steps_refine(cache, monkeypatch) -> None:
    """The first engine measures every (batch, nodes) cell of its grid and writes them; a
    second engine on the same model measures nothing and predicts the same; a job with one
    more K measures only that K's cells; running rows feeds every step back."""
    torch.manual_seed(0)
    model = TreeModel.random(TINY, torch.float32, "cpu", 2, MAX_LEN)
    counted = Counted()
    monkeypatch.setattr(profile, "measure_cell", counted)
    first = engine(model, 2, {**NGRAM, "k_grid": [0, 2]}).step_profile
    assert (first.batches, first.nodes) == ([1, 2], [0, 2])
    assert sorted(counted.cells) == [(1, 0), (1, 2), (2, 0), (2, 2)]
    assert first.measured_s > 0 and [p.name for p in cache.iterdir()] == [f"{first.key}.json"]
    assert all(s > 0 for row in first.table for s in row)

    counted.cells.clear()
    eng = engine(model, 2, {**NGRAM, "k_grid": [0, 2]})
    again = eng.step_profile
    assert counted.cells == [] and again.measured_s == 0 and again.table == first.table
    run_units(eng, units(random_prompts(4, 10, seed=4), [2, 0]))
    seen = again.check.cells  # every step checked against its cell (test_step_check)
    assert again.check.pool.steps > 0 and {n for _, n in seen} <= {0, 1, 2}

    more = engine(model, 2, {**NGRAM, "k_grid": [0, 2, 5]}).step_profile
    assert sorted(counted.cells) == [(1, 5), (2, 5)]
    assert more.nodes == [0, 2, 5] and [row[:2] for row in more.table] == first.table


def test_the_key_names_dtype_threads_and_model() -> None:
    """A profile measured in float32 or with 2 threads is not another setting's."""
    torch.manual_seed(0)
    f32 = TreeModel.random(TINY, torch.float32, "cpu", 2, MAX_LEN)
    bf16 = TreeModel.random(TINY, torch.bfloat16, "cpu", 2, MAX_LEN)
    wider = TreeModel.random({**TINY, "hidden_size": 64}, torch.float32, "cpu", 2, MAX_LEN)
    key = profile_key(f32, "m")
    assert key == profile_key(f32, "m")
    assert len({key, profile_key(bf16, "m"), profile_key(wider, "m"), profile_key(f32, "n")}) == 4
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert profile_key(f32, "m") != key
    finally:
        torch.set_num_threads(threads)


def test_seconds_interpolate_between_cells_and_one_real_step_moves_nothing() -> None:
    p = StepProfile([1, 4], [0, 2], [[1.0, 3.0], [4.0, 6.0]])
    assert (p.seconds(1, 0), p.seconds(4, 2)) == (1.0, 6.0)
    assert p.seconds(2, 1) == pytest.approx(3.0)  # 2 at batch 1, 5 at batch 4
    assert p.seconds(7, 0) == pytest.approx(7.0)  # beyond the cells: the last slope
    p.observe(1, 0, 2.0)  # a real plain step took twice the forward: one step is no evidence
    assert p.seconds(1, 0) == 1.0 and p.check.cells[(1, 0)].steps == 1


def test_a_profile_is_measured_on_an_idle_engine_only() -> None:
    model = TreeModel.random(TINY, torch.float32, "cpu", 2, MAX_LEN)
    model.prefill(1, [1, 2, 3])
    with pytest.raises(RuntimeError, match="idle engine"):
        profile.measure(model, [(1, 0)])
