"""K changed in a running vLLM engine (``engines.vllm_live_k``): the engine an adaptive job
builds, the table its scheduler reads K from, and what a switch is priced at. The proof that a
real engine runs each K it is told is end to end: ``test_e2e.py::test_k_switches_inside_one_engine``
and the replay check there (replay at the row's K equals vLLM's own count on every row)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from conftest import job_dict, write_job
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from batchspec.engines.vllm_args import live_top_k, speculative_config
from batchspec.engines.vllm_batch import _at_k
from batchspec.engines.vllm_engine import VllmEngine
from batchspec.engines.vllm_live_k import METHOD, _set_k, install, set_k
from batchspec.spec_file import load_spec


def spec_of(tmp_path: Path, **speculative: object):
    job = job_dict(tmp_path / "out", speculative=speculative)
    return load_spec(write_job(tmp_path / "job.yaml", job))


def test_an_adaptive_job_builds_one_engine_at_its_top_k_with_a_schedule(tmp_path: Path) -> None:
    """Built at the grid's top K, every batch size at the K asked for (K=0 too, where plain
    decoding would build no speculative config): vLLM's own parser expands it to that K."""
    spec = spec_of(tmp_path, k_grid=[0, 2, 4, 6], num_speculative_tokens=3)
    assert live_top_k(spec) == 6
    for k in (0, 3, 6):
        cfg = speculative_config(spec, k)
        assert cfg is not None and cfg["num_speculative_tokens"] == 6
        schedule = cfg["num_speculative_tokens_per_batch_size"]
        assert schedule == [[1, 8, k]]
        assert build_dynamic_sd_schedule_lookup(schedule, 8, 6)[1:] == [k] * 8


def test_a_fixed_k_or_vllms_own_schedule_gets_exactly_the_engine_asked_for(
    tmp_path: Path,
) -> None:
    fixed = spec_of(tmp_path, adaptive=False, num_speculative_tokens=3)
    assert live_top_k(fixed) is None
    assert speculative_config(fixed, 0) is None
    cfg = speculative_config(fixed, 3)
    assert cfg is not None and cfg["num_speculative_tokens"] == 3
    assert "num_speculative_tokens_per_batch_size" not in cfg
    scheduled = spec_of(
        tmp_path, adaptive=False, num_speculative_tokens=4, k_by_batch_size=[[1, 2, 4], [3, 8, 0]]
    )
    assert live_top_k(scheduled) is None
    cfg = speculative_config(scheduled, 4)
    assert cfg is not None
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 0]]


def test_set_k_replaces_the_schedulers_table_capped_at_the_engines_k() -> None:
    """The utility vLLM's engine core runs: every batch size at the new K, never above the K
    the engine was built with; -1 where the engine has no table (no schedule, or data
    parallelism, which disables it)."""
    lookup = build_dynamic_sd_schedule_lookup([[1, 8, 3]], 8, 8)
    core = SimpleNamespace(scheduler=SimpleNamespace(dynamic_sd_lookup=lookup, num_spec_tokens=8))
    assert set_k(SimpleNamespace(engine_core=core), 5) == 5  # in this process
    assert core.scheduler.dynamic_sd_lookup == [5] * 9
    assert _set_k(core, 0) == 0 and core.scheduler.dynamic_sd_lookup == [0] * 9
    assert _set_k(core, 12) == 8 and core.scheduler.dynamic_sd_lookup == [8] * 9
    none = SimpleNamespace(scheduler=SimpleNamespace(dynamic_sd_lookup=None, num_spec_tokens=8))
    assert _set_k(none, 2) == -1
    calls = []
    remote = SimpleNamespace(call_utility=lambda name, k: calls.append((name, k)) or k)
    assert set_k(remote, 4) == 4 and calls == [(METHOD, 4)]  # in the engine core's process


def test_the_plugin_gives_vllms_engine_core_the_utility() -> None:
    from vllm.v1.engine.core import EngineCore

    install()
    assert getattr(EngineCore, METHOD) is _set_k


def test_the_histogram_is_cut_to_the_k_that_ran() -> None:
    metrics = {"acceptance_histogram": [4, 2, 1, 0, 0, 0, 0, 0, 0], "num_spec_steps": 7}
    assert _at_k(metrics, 3)["acceptance_histogram"] == [4, 2, 1, 0]
    assert _at_k(metrics, 8) == metrics
    odd = {"acceptance_histogram": [1, 0, 0, 0, 0, 2]}  # a count past K: left as vLLM gave it
    assert _at_k(odd, 3) == odd


def test_a_switch_costs_a_drain_where_the_engine_switches_and_a_start_elsewhere() -> None:
    engine = VllmEngine.__new__(VllmEngine)
    engine.build_s, engine.drain_loss_s, engine._row_s = 40.0, None, [0, 0.0]
    engine.top_k = None
    assert engine.switch_cost_s == 40.0
    engine.top_k = 8
    assert engine.switch_cost_s is None  # nothing known yet: each domain at its own best K
    engine._row_s = [4, 36.0]
    assert engine.switch_cost_s == 4.5  # half a row's mean lifetime
    engine.drain_loss_s = 2.5
    assert engine.switch_cost_s == 2.5
