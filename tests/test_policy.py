"""K planning that scales, unbiased α, and tuning files that belong to the job: no vLLM."""

from __future__ import annotations

import itertools
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import job_dict, run_cli, write_job
from support.tuning import edit_tuning, write_ngram_tuning
from test_controller import policy_with_rates

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec.file import load_spec
from batchspec.speculation import policy as policy_module
from batchspec.speculation.controller import Controller
from batchspec.speculation.engine_sets import cheapest_engine_set
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import KPolicy
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.tuning import TuningFile, tuning_identity
from batchspec.units import RowRequest, RowResult, SpecStats, WorkUnit
from batchspec.work.leases import Leases
from batchspec.work.scheduler import COUNT_WORKERS_S, Scheduler

# -- α with drafts shorter than K ---------------------------------------------------------


def row(spec: SpecStats, tokens: int, running_s: float = 1.0) -> RowResult:
    timing = {"queued": 0.0, "scheduled": 0.0, "first_token": 0.1, "last_token": running_s}
    return RowResult(RowRequest(0, "r", "d", {}), "x", 5, tokens, "length", spec, timing)


def vllm_metrics(k: int, drafted: list[int], accepted: list[int], detailed: bool) -> SpecStats:
    """What vLLM 0.32's ``RequestSpecDecodeMetrics.to_dict`` gives for these verify steps, as
    the vLLM adapter reads it."""
    hist = [0] * (k + 1)
    for a in accepted:
        hist[a] += 1
    spec = {
        "acceptance_histogram": hist,
        "num_spec_steps": len(accepted),
        "num_accepted_draft_tokens": sum(accepted),
        "num_draft_tokens": sum(drafted),
    }
    if detailed:
        spec |= {"per_step_accepted": accepted, "per_step_drafted": drafted}
    return SpecStats.from_vllm(spec)


def test_a_short_draft_accepted_in_full_is_not_a_rejection() -> None:
    # K=4; steps drafted 4, 4, 2, 1, 4 tokens and accepted 4, 2, 2, 1, 0: two rejections
    # (steps 2 and 5). The histogram alone puts four steps below its top bucket.
    drafted, accepted = [4, 4, 2, 1, 4], [4, 2, 2, 1, 0]
    ob = Observation("d", 4, 8)
    ob.add(row(vllm_metrics(4, drafted, accepted, detailed=True), tokens=15))
    assert (ob.accepted, ob.rejections) == (9, 2)
    ctl = Controller(8, [0, 4], default_k=4)
    ctl.add(ob)
    assert ctl.domain_model("d").alpha == (9 + 1) / (9 + 2 + 2)  # posterior mean, exactly


def test_summary_metrics_bound_rejections_by_unaccepted_draft_tokens() -> None:
    # Only short drafts, all accepted: no rejection at all, though no step reached bucket K.
    ob = Observation("d", 5, 8)
    ob.add(row(vllm_metrics(5, [2, 3, 1], [2, 3, 1], detailed=False), tokens=10))
    assert (ob.accepted, ob.rejections) == (6, 0)
    # Drafts of K tokens: every step below the top bucket rejected one.
    ob = Observation("d", 3, 8)
    ob.add(row(vllm_metrics(3, [3, 3, 3, 3], [3, 0, 1, 2], detailed=False), tokens=11))
    assert ob.rejections == 3


def test_alpha_of_variable_length_drafts_is_unbiased() -> None:
    rng = random.Random(3)
    alpha, k = 0.7, 5
    ob = Observation("d", k, 8)
    old_rejections = 0
    for _ in range(200):
        drafted = [rng.randint(1, k) for _ in range(40)]
        accepted = []
        for d in drafted:
            j = 0
            while j < d and rng.random() < alpha:
                j += 1
            accepted.append(j)
        spec = vllm_metrics(k, drafted, accepted, detailed=True)
        ob.add(row(spec, tokens=len(drafted) + sum(accepted)))
        old_rejections += sum(spec.histogram[:-1])
    ctl = Controller(8, [0, k], default_k=k)
    ctl.add(ob)
    model = ctl.domain_model("d")
    assert abs(model.alpha - alpha) <= 4 * model.alpha_std
    # Counting every step below bucket K as a rejection is far off.
    assert ob.accepted / (ob.accepted + old_rejections) < alpha - 0.1


# -- the engine plan ----------------------------------------------------------------------


def brute_force(seconds, grid, required, engine_k, build_s) -> float:
    """The cheapest cost over every non-empty set of K, as the plan used to enumerate it."""
    best = math.inf
    for n in range(1, len(grid) + 1):
        for ks in itertools.combinations(range(len(grid)), n):
            engines = required | {grid[j] for j in ks}
            new = len(engines - {engine_k}) if engine_k is not None else len(engines) - 1
            cost = seconds[:, list(ks)].min(axis=1).sum() + new * build_s
            best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_engine_plan_is_the_cheapest_set_of_engines(seed: int) -> None:
    rng = np.random.default_rng(seed)
    grid = sorted(rng.choice(np.arange(9), size=rng.integers(1, 7), replace=False).tolist())
    seconds = rng.uniform(10, 100, size=(int(rng.integers(1, 12)), len(grid)))
    seconds[rng.random(seconds.shape) < 0.3] = np.inf  # K without prediction for a domain
    seconds[:, 0] = rng.uniform(10, 100, size=seconds.shape[0])  # but one K for each
    required = set(rng.choice([0, 2, 7, 11], size=rng.integers(0, 3)).tolist())
    engine_k = [None, grid[-1], 11][seed % 3]
    build_s = float(rng.uniform(0, 80))
    cols = cheapest_engine_set(seconds, grid, required, engine_k, build_s)
    engines = required | {grid[c] for c in cols}
    new = len(engines - {engine_k}) if engine_k is not None else len(engines) - 1
    cost = seconds[:, cols].min(axis=1).sum() + new * build_s
    assert cost == pytest.approx(brute_force(seconds, grid, required, engine_k, build_s))


def test_a_worker_weighs_engine_starts_against_its_share_of_the_rows(tmp_path: Path) -> None:
    policy = policy_with_rates(
        tmp_path,
        {("a", 0): 10.0, ("a", 1): 13.0, ("a", 3): 14.0, ("b", 0): 14.0, ("b", 1): 13.0},
    )
    policy.ctl.add(Observation("b", 3, 8, rows=100, output_tokens=10_000, running_s=1000.0))
    policy.measured_start(60.0)
    rows = {"a": 800, "b": 800}
    # Alone, a second engine saves 2 x (10,000/13 - 10,000/14) = 110 s: worth 60 s.
    assert policy.decide(rows, None, workers=1).plan == {"a": 3, "b": 0}
    # One of four workers runs a quarter of those rows: 27 s saved, not worth a start.
    assert policy.decide(rows, None, workers=4).plan == {"a": 1, "b": 1}


# -- decisions off the engine's per-step path ----------------------------------------------


def units(domain: str, n: int) -> list[WorkUnit]:
    return [WorkUnit(0, "in.parquet", 8 * i, 8 * i + 8, domain, 8) for i in range(n)]


def test_the_scheduler_decides_again_only_when_something_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_with_rates(
        tmp_path, {("a", 0): 10.0, ("a", 3): 14.0, ("b", 0): 14.0, ("b", 3): 10.0}
    )
    policy.measured_start(2.0)  # a second engine pays; probing K=1 does not
    now = [time.monotonic()]
    monkeypatch.setattr(policy_module.time, "monotonic", lambda: now[0])
    calls = []
    decide = policy.decide
    monkeypatch.setattr(policy, "decide", lambda *a: calls.append(a) or decide(*a))
    counted = []
    scheduler = Scheduler(units("a", 4) + units("b", 3), policy, lambda: counted.append(1) or 1)
    assert scheduler.next_engine(None)[0] == 3  # "a" is planned at K=3, "b" at K=0
    assert [scheduler.next_unit(3).domain for _ in range(3)] == ["a"] * 3
    assert scheduler.next_unit(3) is None  # nothing more at K=3: the engine drains
    decided = len(calls)
    for _ in range(1000):  # the engine asks at every step while its batch drains
        assert scheduler.next_unit(3) is None
    assert len(calls) == decided and len(counted) == 1
    # Another worker shares a measurement: read a few seconds later, not at every step.
    SharedStats(OutDir(tmp_path / "out"), "other").append(
        Observation("b", 3, 8, rows=100, output_tokens=10_000, running_s=100.0)
    )
    scheduler.next_unit(3)
    assert len(calls) == decided
    now[0] += policy_module.REFRESH_S
    # "b" is now far faster at K=3: the engine up takes its units.
    assert scheduler.next_unit(3).domain == "b"
    assert len(calls) == decided + 1 and len(counted) == 1
    # A unit this worker commits is a change too.
    policy.observe(Observation("a", 3, 8, rows=8, output_tokens=800, running_s=60.0))
    assert scheduler.next_unit(3).domain == "b"
    assert len(calls) == decided + 2
    # Live workers are counted again now and then (and their number is an input).
    now[0] += COUNT_WORKERS_S
    scheduler.next_unit(3)
    assert len(counted) == 2


def test_live_workers_are_the_workers_with_a_heartbeat_record(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    one = Leases(out, "w1", timeout_s=60, heartbeat_s=10)
    two = Leases(out, "w2", timeout_s=60, heartbeat_s=10)
    one.beat()
    two.beat()
    assert one.try_claim("u1") and two.try_claim("u2") and two.try_claim("u3")
    assert one.live_workers() == 2
    three = Leases(out, "w3", timeout_s=60, heartbeat_s=10)
    three.beat()
    assert not three.try_claim("u2")  # w2 beats: held
    three.retire("w2")  # found dead by a watcher: its record moves to progress/
    assert three.try_claim("u3")  # its leases are free at once, whatever their age
    assert not out.progress("w2").exists() and three.live_workers() == 2


# -- tuning files ---------------------------------------------------------------------------


def tuned_job(tmp_path: Path, **tuned_with: dict) -> tuple[Path, Path]:
    """A job, and a tuning file for it measured with the job's settings but ``tuned_with``."""
    job = write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out"))
    other = write_job(tmp_path / "other.yaml", job_dict(tmp_path / "out", **tuned_with))
    ob = Observation("code", 3, 8, rows=10, output_tokens=2000, running_s=100.0, accepted=500)
    path = OutDir(tmp_path / "out").tuning
    write_ngram_tuning(path, other, [ob])
    return job, path


@pytest.mark.parametrize(
    ("tuned_with", "field"),
    [
        ({"sampling": {"temperature": 0.7}}, "sampling.temperature"),
        ({"model": {"dtype": "bfloat16"}}, "model.dtype"),
        ({"speculative": {"method": "suffix"}}, "speculative.method"),
        ({"model": {"model": "/models/other"}}, "model.model"),
    ],
)
def test_a_tuning_file_from_another_job_is_refused(
    tmp_path: Path, tuned_with: dict, field: str
) -> None:
    job, path = tuned_job(tmp_path, **tuned_with)
    with pytest.raises(UserError, match=field):
        KPolicy(load_spec(job), OutDir(tmp_path / "out"), "w")

    def rebind(tuning: TuningFile) -> None:
        tuning.identity = tuning_identity(load_spec(job))

    edit_tuning(path, rebind)
    policy = KPolicy(load_spec(job), OutDir(tmp_path / "out"), "w")
    assert ("code", 3) in policy.ctl.obs


def test_run_refuses_a_tuning_file_of_another_sampling(tmp_path: Path) -> None:
    job, _ = tuned_job(tmp_path, sampling={"max_tokens": 99})
    result = run_cli("run", str(job), "--limit", "8", "--no-progress")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "sampling.max_tokens=99" in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "out").glob("parts/*.parquet"))


# -- the chosen K against measurements ------------------------------------------------------


def measured(domain: str, k: int, rates: list[float], accepted: int, rejections: int):
    """A sample of rows of ``domain`` at K decoding at these per-row rates (100 tokens each)."""
    ob = Observation(domain, k, 8, accepted=accepted, rejections=rejections)
    for rate in rates:
        spec = SpecStats(steps=0, drafted=0, accepted=0, histogram=(0,))
        ob.add(row(spec, tokens=100, running_s=100 / rate))
    ob.accepted, ob.rejections, ob.spec_steps, ob.decode_steps = accepted, rejections, 60, 60
    return ob


def test_the_chosen_k_never_loses_clearly_to_a_measured_k() -> None:
    ctl = Controller(8, [0, 2, 8], default_k=2)
    # Long drafts are cheap on the pooled step times (another domain measured at length)...
    for k, rate in ((0, 10.0), (2, 18.0), (8, 30.0)):
        ctl.add(Observation("big", k, 8, rows=1000, output_tokens=100_000, running_s=1e5 / rate))
    # ..."math" accepts well, so the model predicts K=8 best; but its own short sample (8 rows,
    # 800 tokens: below the threshold at which measured rates replace the model) decoded at
    # K=2 clearly faster than at K=8.
    ctl.add(measured("math", 2, [20.0, 21.0, 19.5, 20.5, 20.0, 19.0, 21.0, 20.0], 300, 30))
    ctl.add(measured("math", 8, [15.0, 14.5, 15.5, 15.0, 14.0, 16.0, 15.0, 15.0], 300, 30))
    assert ctl.choose("math").k == 2
    # The same means, but rows so varied that 8 rows cannot tell K=2 from K=8: the model stands.
    ctl = Controller(8, [0, 2, 8], default_k=2)
    for k, rate in ((0, 10.0), (2, 18.0), (8, 30.0)):
        ctl.add(Observation("big", k, 8, rows=1000, output_tokens=100_000, running_s=1e5 / rate))
    ctl.add(measured("math", 2, [5.0, 40.0, 8.0, 36.0, 10.0, 30.0, 6.0, 25.0], 300, 30))
    ctl.add(measured("math", 8, [3.0, 30.0, 6.0, 24.0, 7.0, 20.0, 9.0, 21.0], 300, 30))
    choice = ctl.choose("math")
    assert choice.k == 8


def test_a_domain_not_seen_yet_sends_one_unit_until_it_commits(tmp_path: Path) -> None:
    """Input grouped by domain: plan order would fill the batch with "a"'s units, all at the
    K chosen before any of them committed. Instead each new domain sends its first unit, then
    (all new domains under way) plan order resumes; a domain once seen goes first again. With
    speculation fixed nothing is learnt, and plan order stands."""
    (tmp_path / "adaptive").mkdir()
    policy = policy_with_rates(tmp_path / "adaptive", {})
    scheduler = Scheduler(units("a", 3) + units("b", 2) + units("c", 1), policy)
    k, first = scheduler.next_engine(None)
    taken = [first.domain] + [scheduler.next_unit(k).domain for _ in range(3)]
    assert taken == ["a", "b", "c", "a"]
    policy.observe(Observation("a", k, 8, rows=8, output_tokens=800, running_s=60.0))
    assert [scheduler.next_unit(k).domain for _ in range(2)] == ["a", "b"]
    assert scheduler.next_unit(k) is None

    job = job_dict(tmp_path / "out", speculative={"adaptive": False})
    fixed = KPolicy(load_spec(write_job(tmp_path / "job.yaml", job)), OutDir(tmp_path), "w")
    scheduler = Scheduler(units("a", 2) + units("b", 1), fixed)
    k, first = scheduler.next_engine(None)
    assert [first.domain, scheduler.next_unit(k).domain] == ["a", "a"]
