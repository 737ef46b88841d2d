"""``speculative.engine: auto``: the tuning file routes a job to the faster engine; without a
route for its batch size the job is refused, and each engine's measurements stay its own.
No engine starts here (tuning files are made by hand); ``test_tune`` routes a real job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
from conftest import job_dict, run_cli, write_job

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.spec.file import load_spec
from batchspec.spec.tree import AUTO, ENGINES, TREE, VLLM, EngineChoice, EngineName, engines_of
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import KPolicy
from batchspec.speculation.route import format_route, route_job, route_table, with_engine
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.tuning import (
    BatchTuning,
    DomainTuning,
    EngineTuning,
    RouteEntry,
    TuningFile,
    tuning_identity,
    write_tuning,
)


def entry(batch: int, rates: dict[str, float], per_row: dict[str, int]) -> BatchTuning:
    """A tune entry at one batch size: every domain chose K=2, measured at ``rates`` tok/s,
    its rows ``per_row`` output tokens long."""
    domains = {d: DomainTuning(chosen_k=2, tokens_per_s={0: 1.0, 2: r}) for d, r in rates.items()}
    observations = [Observation(d, 2, batch, rows=10, output_tokens=10 * per_row[d]) for d in rates]
    return BatchTuning(batch=batch, domains=domains, observations=observations)


def tuned(*batches: BatchTuning) -> EngineTuning:
    return EngineTuning(k_grid=[0, 2], batches=list(batches))


def test_the_route_weighs_each_domain_by_the_job_s_rows(tmp_path: Path) -> None:
    # vLLM is faster on code, the tree engine on math; rows are 100 and 50 tokens long.
    tokens = {"code": 100, "math": 50}
    engines = {
        "vllm": tuned(entry(8, {"code": 100.0, "math": 20.0}, tokens)),
        "tree": tuned(entry(8, {"code": 50.0, "math": 100.0}, tokens)),
    }
    spec = load_spec(write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out")))
    # Mostly code: 90 code rows (9000 tokens), 10 math rows (500 tokens).
    (route,) = route_table(engines, {"code": 90, "math": 10}, spec)
    vllm = 9500 / (9000 / 100 + 500 / 20)  # 82.6 tok/s
    tree = 9500 / (9000 / 50 + 500 / 100)  # 51.4 tok/s
    assert route.engine == "vllm" and route.batch == 8
    assert route.tokens_per_s == pytest.approx({"vllm": vllm, "tree": tree})
    # Each domain's rate noise, propagated to the total time (none given here: zero).
    assert route.noise == {"vllm": 0.0, "tree": 0.0}
    # A 10 tok/s noise on vLLM's code rate: seconds 9000/100 ± 9000/100² x 10 = 90 ± 9.
    engines["vllm"].batches[0].domains["code"].noise_tokens_per_s = {2: 10.0}
    (route,) = route_table(engines, {"code": 90, "math": 10}, spec)
    assert route.noise["vllm"] == pytest.approx(9500 * 9 / (90 + 25) ** 2)
    assert "-> vllm (1.61x)" in format_route(route)
    # A K fixed per domain is what runs, whatever the controller chose: code at K=0 (1 tok/s).
    fixed = load_spec(tmp_path / "job.yaml", ["speculative.per_domain={code: 0}"])
    (route,) = route_table(engines, {"code": 90, "math": 10}, fixed)
    assert route.tokens_per_s["tree"] == pytest.approx(9500 / (9000 / 1 + 500 / 100))
    # Mostly math: the tree engine.
    (route,) = route_table(engines, {"code": 5, "math": 95}, spec)
    assert route.engine == "tree"
    assert route.tokens_per_s["tree"] == pytest.approx(5250 / (500 / 50 + 4750 / 100))


def test_the_engine_names_are_one_list() -> None:
    """The spec's types of ``speculative.engine`` and of a tuning file's engines name what
    ``ENGINES`` lists (code compares with the names, pydantic checks with the types)."""
    assert get_args(EngineName) == ENGINES == (VLLM, TREE)
    assert get_args(EngineChoice) == (*ENGINES, AUTO)
    assert engines_of(AUTO) == ENGINES and engines_of(TREE) == (TREE,)


def auto_job(tmp_path: Path, **speculative: object) -> Path:
    spec = {"method": "ngram", "engine": "auto", **speculative}
    return write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out", speculative=spec))


def routed_tuning(job: Path, engines: dict[str, int], route: dict[int, str]) -> TuningFile:
    """A tuning file of ``job`` measured on ``engines`` (name: batch size), routing ``route``."""
    spec = load_spec(job)
    tuning = TuningFile(
        identity=tuning_identity(spec),
        engines={e: tuned(entry(b, {}, {})) for e, b in engines.items()},
        route=[RouteEntry(batch=b, engine=e) for b, e in route.items()],
    )
    write_tuning(OutDir(spec.output_dir).tuning, tuning)
    return tuning


def test_an_auto_job_runs_on_the_engine_its_tuning_file_routes_it_to(tmp_path: Path) -> None:
    job = auto_job(tmp_path)
    spec, out = load_spec(job), OutDir(tmp_path / "out")
    with pytest.raises(UserError, match="does not exist: run batchspec tune on the job first"):
        route_job(spec, out)
    routed_tuning(job, {"vllm": 8, "tree": 8}, {8: "tree", 1: "vllm"})
    assert route_job(spec, out).speculative.engine == "tree"
    one = load_spec(job, ["model.max_num_seqs=1"])
    assert route_job(one, out).speculative.engine == "vllm"
    other = load_spec(job, ["model.max_num_seqs=16"])
    with pytest.raises(UserError, match=r"routes batch sizes \[8, 1\].*--batch 16"):
        route_job(other, out)
    # An engine of its own needs no tuning file, and the routed spec is the job's otherwise.
    assert route_job(with_engine(spec, "vllm"), out).speculative.engine == "vllm"
    assert with_engine(spec, "tree").content_hash() == spec.content_hash()


def test_a_run_routes_once_and_its_worker_gets_the_routed_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_run`` routes; ``run_job`` hands that spec to its worker (no second route, no
    second read of the tuning file). The worker is a stand-in: no engine starts."""
    from batchspec.work import prepare, worker

    job = auto_job(tmp_path)
    routed_tuning(job, {"vllm": 8, "tree": 8}, {8: "tree"})
    calls, given = [], []
    real = prepare.route_job
    monkeypatch.setattr(prepare, "route_job", lambda *a: calls.append(a) or real(*a))

    class Stand:
        def __init__(self, spec: JobSpec, *_: object) -> None:
            given.append(spec)

        def run(self, *_: object) -> None:
            return None

    monkeypatch.setattr(worker, "Worker", Stand)
    worker.run_job(load_spec(job), limit=8, progress=False)
    assert len(calls) == 1 and [s.speculative.engine for s in given] == ["tree"]


def test_a_tuning_file_of_one_engine_does_not_serve_another(tmp_path: Path) -> None:
    job = auto_job(tmp_path)
    spec, out = load_spec(job), OutDir(tmp_path / "out")
    routed_tuning(job, {"vllm": 8}, {})
    with pytest.raises(UserError, match="measured on the vllm engine, the job runs on tree"):
        route_job(spec, out)
    # Tree settings are the tree engine's measurements: other ones are another job.
    routed_tuning(job, {"vllm": 8, "tree": 8}, {8: "tree"})
    deeper = load_spec(job, ["speculative.tree={max_depth: 3}"])
    with pytest.raises(UserError, match=r"speculative\.tree="):
        route_job(deeper, out)
    # A file from before engines were recorded.
    path = out.tuning
    data = json.loads(path.read_text())
    del data["engines"]
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="older batchspec tune"):
        route_job(spec, out)


def test_a_worker_learns_only_from_units_of_its_own_engine(tmp_path: Path) -> None:
    job = auto_job(tmp_path)
    routed_tuning(job, {"vllm": 8, "tree": 8}, {8: "tree"})
    spec, out = load_spec(job), OutDir(tmp_path / "out")
    spec = route_job(spec, out)
    ob = Observation("code", 2, 8, rows=4, output_tokens=400, running_s=10.0)
    for engine in ("vllm", "tree", None):
        SharedStats(out, f"w-{engine}").append(Observation(**(ob.__dict__ | {"engine": engine})))
    policy = KPolicy(spec, out, "w")
    assert policy.ctl.obs[("code", 2)].rows == 8  # the tree engine's and the untagged one's
    policy.observe(Observation("math", 2, 8, rows=3, output_tokens=300, running_s=5.0))
    (line,) = (out.stats / "w.jsonl").read_text().splitlines()
    assert json.loads(line)["engine"] == "tree"


def test_an_auto_job_without_a_tuning_file_is_refused_before_any_engine(tmp_path: Path) -> None:
    result = run_cli("run", str(auto_job(tmp_path)), "--limit", "8", "--no-progress")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "speculative.engine: auto" in result.stderr and "batchspec tune" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "out").glob("parts/*.parquet"))
    result = run_cli("validate", str(auto_job(tmp_path)))  # refuses what run refuses
    assert result.returncode == 2, result.stderr[-2000:]
    assert "speculative.engine: auto" in result.stderr and "batchspec tune" in result.stderr


def test_a_job_that_may_run_on_vllm_is_refused_where_vllm_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CUDA machine with torch and transformers only: the tree engine runs there, vLLM not.
    from batchspec.io import checks

    real = checks.importlib.util.find_spec
    monkeypatch.setattr(
        checks.importlib.util, "find_spec", lambda name: None if name == "vllm" else real(name)
    )
    for engine in ("auto", "vllm"):
        spec = load_spec(auto_job(tmp_path), [f"speculative.engine={engine}"])
        with pytest.raises(UserError, match=f"speculative.engine: {engine} needs vLLM"):
            checks.preflight(spec, limit=8)
    assert checks.preflight(load_spec(auto_job(tmp_path), ["speculative.engine=tree"]), limit=8)
