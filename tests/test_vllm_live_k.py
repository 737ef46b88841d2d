"""K per request in one vLLM engine (``engines.vllm_live_k``): the engine an adaptive job
builds, the K each step drafts at, and the drafts each request keeps. The proof that a
real engine runs each row at its K is end to end: ``test_e2e.py``'s run has units at several K
in one engine, and its replay check (replay at the row's K equals vLLM's own count) fails if a
row verified any other number of drafts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from conftest import job_dict, write_job
from vllm import SamplingParams
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from batchspec.engines.vllm_args import live_top_k, speculative_config
from batchspec.engines.vllm_batch import _at_k
from batchspec.engines.vllm_live_k import (
    KEY,
    METHOD,
    _nothing_at_k0,
    _per_request_k,
    _set_k,
    _trimmed,
    _trimmed_placeholders,
    install,
    set_k,
)
from batchspec.spec.file import load_spec


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


def test_under_data_parallelism_a_k_change_is_another_engine(tmp_path: Path) -> None:
    # vLLM disables its K schedule with data_parallel_size > 1: an engine built for K per unit
    # would ignore every unit's K, so the job gets engines at each K, as before K per unit.
    job = job_dict(tmp_path / "out", model={"engine_kwargs": {"data_parallel_size": 2}})
    spec = load_spec(write_job(tmp_path / "job.yaml", job))
    assert spec.speculative.adaptive and live_top_k(spec) is None
    cfg = speculative_config(spec, 3)
    assert cfg is not None and cfg["num_speculative_tokens"] == 3
    assert speculative_config(spec, 0) is None


def request(k: int | None, drafts: list[int] | None = None) -> SimpleNamespace:
    """A request as vLLM's scheduler holds it: its sampling parameters, its drafts."""
    extra = None if k is None else {KEY: k}
    params = SamplingParams(max_tokens=4, extra_args=extra)
    return SimpleNamespace(sampling_params=params, spec_token_ids=list(drafts or []))


def scheduler(requests: dict[str, SimpleNamespace], top: int = 8) -> SimpleNamespace:
    lookup = build_dynamic_sd_schedule_lookup([[1, 8, 3]], 8, top)
    return SimpleNamespace(dynamic_sd_lookup=lookup, num_spec_tokens=top, requests=requests)


def test_set_k_is_the_k_of_requests_without_one_capped_at_the_engines() -> None:
    """The utility vLLM's engine core runs; -1 where the engine has no per-step K (no
    schedule, or data parallelism, which disables it)."""
    core = SimpleNamespace(scheduler=scheduler({}))
    assert set_k(SimpleNamespace(engine_core=core), 5) == 5  # in this process
    assert core.scheduler.batchspec_k == 5
    assert _set_k(core, 12) == 8
    none = SimpleNamespace(scheduler=SimpleNamespace(dynamic_sd_lookup=None, num_spec_tokens=8))
    assert _set_k(none, 2) == -1
    calls = []
    remote = SimpleNamespace(call_utility=lambda name, k: calls.append((name, k)) or k)
    assert set_k(remote, 4) == 4 and calls == [(METHOD, 4)]  # in the engine core's process


def test_each_step_drafts_the_largest_k_a_request_in_the_engine_asked_for() -> None:
    seen = []
    sched = scheduler({"a": request(2), "b": request(5), "c": request(None)})
    sched.batchspec_k = 3
    step = _per_request_k(lambda self: seen.append(list(self.dynamic_sd_lookup)))
    step(sched)
    assert seen[-1] == [5] * 9
    sched.requests = {"a": request(0), "c": request(None)}  # c at the engine's K
    step(sched)
    assert seen[-1] == [3] * 9
    sched.requests = {"a": request(0)}
    step(sched)
    assert seen[-1] == [0] * 9  # nobody speculates: the proposer drafts nothing
    sched.requests = {"a": request(12)}
    step(sched)
    assert seen[-1] == [8] * 9  # never above the engine's K


def test_each_request_keeps_only_its_own_k_drafts() -> None:
    """Drafts of the step's K come back for every request; each keeps its first K (a chain's
    first K drafts are a K-draft chain), with synchronous and asynchronous scheduling."""
    reqs = {"a": request(2), "b": request(0), "c": request(None), "d": request(6)}
    sched = scheduler(reqs)
    sched.batchspec_k = 3

    def propose(self, out):
        for r in self.requests.values():
            r.spec_token_ids = [11, 12, 13, 14, 15, 16]

    _trimmed(propose)(sched, SimpleNamespace(req_ids=list(reqs)))
    assert [r.spec_token_ids for r in reqs.values()] == [
        [11, 12],
        [],
        [11, 12, 13],
        [11, 12, 13, 14, 15, 16],
    ]
    placeholders = _trimmed_placeholders(propose)
    placeholders(sched, SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 1, "d": 1}))
    assert [len(reqs[i].spec_token_ids) for i in "abcd"] == [2, 0, 6, 6]  # c not scheduled
    plain = scheduler(reqs)  # no engine K set: an engine that is not batchspec's, untouched
    _trimmed(propose)(plain, SimpleNamespace(req_ids=list(reqs)))
    assert all(len(r.spec_token_ids) == 6 for r in reqs.values())


def test_a_step_at_k0_does_not_call_the_ngram_proposer() -> None:
    calls = []
    propose = _nothing_at_k0(lambda self, k, sampled, *rest: calls.append(k) or [[7] * k])
    assert propose(None, 0, [[1], [2], [3]], "tokens") == [[], [], []] and calls == []
    assert propose(None, 2, [[1]], "tokens") == [[7, 7]] and calls == [2]


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
