"""Edge cases of export, status and progress records on synthetic output directories (the
real thing runs in test_observe_run.py): unfinished runs, wrong ids, shard bounds, error rows,
an occupied destination, progress added up over workers."""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchspec.cli import main
from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, input_fingerprint
from batchspec.io.planner import plan_units
from batchspec.io.writer import output_schema
from batchspec.observe.export import export_dataset
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work.leases import Leases
from batchspec.work.live import LiveProgress
from batchspec.work.progress import ProgressLog, add_up, read_records

DOMAINS = ["a", "b", "c"]
SCHEMA = output_schema(pa.string(), {})


def text(i: int, size: int) -> str:
    return "".join(random.Random(i).choices("abcdefghij klmnop", k=size))


def synthetic_run(tmp: Path, rows: int = 30, unit_rows: int = 4, text_bytes: int = 20) -> OutDir:
    """An input with domains interleaved and every unit committed, as a run leaves them."""
    inp = tmp / "in.parquet"
    ids = [f"r{i:05d}" for i in range(rows)]
    domains = [DOMAINS[(i * 7 // 3) % 3] for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "domain": domains, "prompt": ["p"] * rows}), inp)
    out = OutDir(tmp / "out")
    units = plan_units([inp], unit_rows, "domain")
    manifest = Manifest("h", input_fingerprint([inp]), None, len(units), rows, time.time(), "0")
    out.parts.mkdir(parents=True)
    out.manifest.write_text(json.dumps(manifest.__dict__))
    spec = {
        "name": "synthetic",
        "input": {"id_column": "id", "domain_column": "domain"},
        "output": {"unit_rows": unit_rows},
        "model": {"model": "m", "dtype": "float32", "max_num_seqs": 4},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 0.0, "max_tokens": 8},
    }
    record = {"spec": spec, "base_dir": str(tmp), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(record))
    for u in units:
        write_part(
            out, u, [i for i in range(u.start, u.stop) if domains[i] == u.domain], text_bytes
        )
    return out


def write_part(out: OutDir, unit: WorkUnit, rows: list[int], text_bytes: int) -> None:
    def row(i: int) -> dict:
        base = {"id": f"r{i:05d}", "domain": unit.domain, "unit_id": unit.unit_id}
        if i % 11 == 5:
            return base | {"error": "prompt is empty"}
        return base | {"generated_text": text(i, text_bytes), "num_output_tokens": 4}

    pq.write_table(pa.Table.from_pylist([row(i) for i in rows], SCHEMA), out.part(unit.unit_id))


def exported(dest: Path) -> pa.Table:
    return pads.dataset(dest / "data", format="parquet").to_table()


def test_export_puts_interleaved_domains_back_in_input_order(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    r = export_dataset(out, tmp_path / "ds")
    got = exported(tmp_path / "ds")
    assert got.column("id").to_pylist() == [f"r{i:05d}" for i in range(30)]
    assert r.rows == 30 and r.error_rows == 3 and r.shards == 1
    assert got.column("generated_text")[0].as_py() == text(0, 20)
    dropped = export_dataset(out, tmp_path / "ds2", include_errors=False)
    ids = exported(tmp_path / "ds2").column("id").to_pylist()
    assert ids == [f"r{i:05d}" for i in range(30) if i % 11 != 5] and dropped.rows == 27


def test_unfinished_run_is_refused_unless_allowed(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    victim = out.part_files()[2]
    missing = pq.read_table(victim).column("id").to_pylist()
    victim.unlink()
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(tmp_path / "ds")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "unfinished run" in result.stderr and "--allow-unfinished" in result.stderr
    assert not (tmp_path / "ds").exists()
    r = export_dataset(out, tmp_path / "ds", allow_unfinished=True)
    want = [f"r{i:05d}" for i in range(30) if f"r{i:05d}" not in missing]
    assert exported(tmp_path / "ds").column("id").to_pylist() == want
    assert r.missing_rows == len(missing)
    assert "not generated yet" in (tmp_path / "ds" / "README.md").read_text()


def test_a_wrong_or_repeated_id_is_refused_naming_the_part(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    part = next(p for p in out.part_files() if pq.read_metadata(p).num_rows >= 2)
    table = pq.read_table(part)
    ids = table.column("id").to_pylist()
    ids[-1] = ids[0]  # the unit's first id twice, its last one gone
    pq.write_table(table.set_column(0, "id", pa.array(ids)), part)
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(tmp_path / "ds")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert part.name in result.stderr and repr(ids[0]) in result.stderr
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.*"))


def test_shards_stay_under_their_bound(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path, rows=3000, unit_rows=64, text_bytes=400)
    r = export_dataset(out, tmp_path / "ds", shard_mb=0.1)
    names = sorted(p.name for p in (tmp_path / "ds" / "data").iterdir())
    assert len(names) == r.shards >= 4
    assert names == [f"train-{i:05d}-of-{r.shards:05d}.parquet" for i in range(r.shards)]
    sizes = [(tmp_path / "ds" / "data" / n).stat().st_size for n in names]
    assert max(sizes) <= 0.1 * (1 << 20) * 1.1, sizes
    got = exported(tmp_path / "ds")
    assert got.column("id").to_pylist() == [f"r{i:05d}" for i in range(3000)]


def test_an_occupied_destination_is_refused_an_empty_one_used(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(tmp_path / "full")])
    assert result.exit_code == 2 and "not empty" in result.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    assert export_dataset(out, tmp_path / "empty").rows == 30


def unit_result(domain: str, rows: int, k: int = 3) -> UnitResult:
    unit = WorkUnit(0, "in", 0, rows, domain, rows)
    reqs = [RowRequest(i, f"{domain}{i}", domain, {}) for i in range(rows)]
    spec = {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_draft_tokens": 6}
    results = [RowResult(r, "t", 3, 10, "stop", spec) for r in reqs]
    return UnitResult(UnitRequests(unit, reqs), results, k, "ngram")


def test_progress_records_add_up_over_workers(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    a, b = ProgressLog(out, "a", "run"), ProgressLog(out, "b", "run")
    a.committed(unit_result("x", 4))
    b.committed(unit_result("x", 2))
    b.committed(unit_result("y", 3, k=0))
    open_unit = UnitRequests(WorkUnit(0, "in", 8, 12, "y", 4), finished=2, finished_tokens=20)
    b.watch(lambda: [open_unit], 0)
    b.write()
    a.end()
    records = read_records(out)
    totals = add_up(records, rows_total=20, legacy=5, live={"b"})
    assert totals.rows_committed == 5 + 9 and totals.rows_done == 5 + 9 + 2
    assert totals.output_tokens == 90 + 20
    x, y = totals.domains["x"], totals.domains["y"]
    assert (x["rows"], x["drafted"], x["accepted"], x["steps"]) == (6, 72, 36, 24)
    assert (y["rows"], y["drafted"], y["k_in_use"]) == (3, 0, [0])
    assert totals.eta_s(2.0) == pytest.approx(2.0)
    rows_s, _, span = totals.rates(records, time.time(), 60)
    assert rows_s == pytest.approx((6 + 9 + 2) / span, rel=0.05) or span < 0.5


def test_status_json_while_units_are_leased(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    parts = out.part_files()
    for p in parts[:2]:
        p.unlink()
    leases = Leases(out, "w1", 60, 1)
    leases.try_claim(parts[0].stem)
    log = ProgressLog(out, "w1", "run")
    log.watch(lambda: [UnitRequests(WorkUnit(0, "in", 0, 4, "a", 2), finished=1)], 3)
    log.write()
    result = CliRunner().invoke(main, ["status", str(out), "--json"])
    assert result.exit_code == 0, result.output
    st = json.loads(result.stdout)
    n = len(parts)
    assert st["state"] == "running"
    assert st["units"] == {
        "total": n,
        "done": n - 2,
        "leased": 1,
        "stale": 0,
        "pending": 1,
        "failed": 0,
    }
    assert st["leases"][0]["unit_id"] == parts[0].stem and st["leases"][0]["worker"] == "w1"
    assert st["leases"][0]["heartbeat_age_s"] < 5 and st["rows"]["finished_uncommitted"] == 1
    assert st["workers"][0]["state"] == "live" and st["workers"][0]["k"] == 3
    assert {d["domain"]: d["k_in_use"] for d in st["domains"]} == {"a": [3]}


def test_a_launchers_progress_adds_up_its_workers_records(tmp_path: Path) -> None:
    """``run --workers N``: the launcher generates nothing; it shows its workers' records."""
    out = OutDir(tmp_path)
    worker = ProgressLog(out, "w1", "run")
    worker.committed(unit_result("x", 4))
    stream = io.StringIO()
    # 6 rows committed at start: the worker's 4, and 2 that no record counts.
    live = LiveProgress(None, out, 10, 6, "log", log_every=1, stream=stream)
    live.start()
    worker.committed(unit_result("y", 3))
    worker.end()
    live.close()
    assert stream.getvalue().splitlines()[-1].startswith("progress: 9/10 rows (90.0%)")
    assert "x 0.50/2.50 K3" in stream.getvalue() and "y 0.50/2.50 K3" in stream.getvalue()
