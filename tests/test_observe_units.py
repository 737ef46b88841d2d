"""Edge cases of export, status and progress records on synthetic output directories (the
real thing runs in test_observe_run.py): unfinished runs, wrong ids, shard bounds, error rows,
an occupied destination, prompts (or messages) beside the generation and --no-prompts, the
dataset card's columns and null acceptance, parts written before a column existed (the
``conform`` rule), progress added up over workers."""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from support.doc_examples import shapes, status_examples

from batchspec.cli import main
from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, input_fingerprint
from batchspec.io.planner import plan_units
from batchspec.io.writer import RESULT_FIELDS, output_schema
from batchspec.observe import scan
from batchspec.observe.card import COLUMN_DOCS, type_name
from batchspec.observe.export import export_dataset
from batchspec.observe.scan import conform, scan_output, table_of
from batchspec.spec.tree import VLLM
from batchspec.units import RowRequest, RowResult, SpecStats, UnitRequests, UnitResult, WorkUnit
from batchspec.work.leases import Leases
from batchspec.work.live import LiveProgress
from batchspec.work.progress import ProgressLog, add_up, read_records

DOMAINS = ["a", "b", "c"]
SCHEMA = output_schema(pa.string(), {})


def text(i: int, size: int) -> str:
    return "".join(random.Random(i).choices("abcdefghij klmnop", k=size))


def prompt(i: int) -> str:
    return f"prompt {i}: {text(i + 1000, 15)}"


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt(i)}]


def synthetic_run(
    tmp: Path, rows: int = 30, unit_rows: int = 4, text_bytes: int = 20, **input_keys: Any
) -> OutDir:
    """An input with domains interleaved and every unit committed, as a run leaves them;
    ``input_keys`` override the job's input section (prompt column ``prompt``)."""
    inp = tmp / "in.parquet"
    ids = [f"r{i:05d}" for i in range(rows)]
    domains = [DOMAINS[(i * 7 // 3) % 3] for i in range(rows)]
    table = pa.table(
        {
            "id": ids,
            "domain": domains,
            "prompt": [prompt(i) for i in range(rows)],
            "messages": [messages(i) for i in range(rows)],
        }
    )
    pq.write_table(table, inp)
    out = OutDir(tmp / "out")
    units = plan_units([inp], unit_rows, "domain")
    manifest = Manifest("h", input_fingerprint([inp]), None, len(units), rows, time.time(), "0")
    out.parts.mkdir(parents=True)
    out.manifest.write_text(json.dumps(manifest.__dict__))
    spec = {
        "name": "synthetic",
        "input": {
            "id_column": "id",
            "prompt_column": "prompt",
            "messages_column": None,
            "domain_column": "domain",
            "passthrough_columns": [],
            **input_keys,
        },
        "output": {"unit_rows": unit_rows},
        "model": {"model": "m", "dtype": "float32", "max_num_seqs": 4},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 0.0, "max_tokens": 8},
    }
    record = {"spec": spec, "base_dir": str(tmp), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(record))
    passed = spec["input"]["passthrough_columns"]
    schema = output_schema(pa.string(), {c: table.schema.field(c).type for c in passed})
    for u in units:
        rows_of = [i for i in range(u.start, u.stop) if domains[i] == u.domain]
        parts = [
            row_of(i, u, text_bytes) | {c: table[c][i].as_py() for c in passed} for i in rows_of
        ]
        pq.write_table(pa.Table.from_pylist(parts, schema), out.part(u.unit_id))
    return out


def row_of(i: int, unit: WorkUnit, text_bytes: int) -> dict:
    """Input row ``i`` as a part holds it: every 11th an error; of the others every 5th ran
    without speculation (K = 0) and every 3rd drafted nothing (K = 3)."""
    base = {"id": f"r{i:05d}", "domain": unit.domain, "unit_id": unit.unit_id}
    if i % 11 == 5:
        return base | {"error": "prompt is empty"}
    base |= {"generated_text": text(i, text_bytes), "num_output_tokens": 4, "engine": "vllm"}
    if i % 5 == 0:
        return base | {"spec_method": "none", "num_speculative_tokens": 0}
    spec = {"spec_method": "ngram", "num_speculative_tokens": 3, "num_accepted_tokens": 0}
    if i % 3 == 0:
        return base | spec | {"num_spec_steps": 0, "num_draft_tokens": 0}
    spec |= {"num_spec_steps": 2, "num_draft_tokens": 6, "num_accepted_tokens": 3}
    return base | spec | {"acceptance_rate": 0.5, "mean_acceptance_length": 2.5}


def exported(dest: Path) -> pa.Table:
    return pads.dataset(dest / "data", format="parquet").to_table()


def test_export_puts_interleaved_domains_back_in_input_order(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    r = export_dataset(out, tmp_path / "ds")
    got = exported(tmp_path / "ds")
    assert got.column("id").to_pylist() == [f"r{i:05d}" for i in range(30)]
    assert r.rows == 30 and r.error_rows == 3 and r.shards == 1
    assert got.column("generated_text")[0].as_py() == text(0, 20)
    # The prompt of row i is input row i's, beside the generation.
    assert got.column("prompt").to_pylist() == [prompt(i) for i in range(30)]
    names = got.column_names
    assert (
        names.index("prompt") + 1 == names.index("generated_text") and r.prompt_column == "prompt"
    )
    dropped = export_dataset(out, tmp_path / "ds2", include_errors=False)
    kept = exported(tmp_path / "ds2")
    ids = kept.column("id").to_pylist()
    assert ids == [f"r{i:05d}" for i in range(30) if i % 11 != 5] and dropped.rows == 27
    assert kept.column("prompt").to_pylist() == [prompt(int(i[1:])) for i in ids]


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
    got = exported(tmp_path / "ds")
    assert got.column("id").to_pylist() == want
    assert got.column("prompt").to_pylist() == [prompt(int(i[1:])) for i in want]
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


def test_no_prompts_leaves_them_out_and_the_card_says_so(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    args = ["export", str(out), "--to", str(tmp_path / "ds"), "--no-prompts"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "no prompt column" in result.stdout
    got = exported(tmp_path / "ds")
    assert "prompt" not in got.column_names and got.column("id").to_pylist() == [
        f"r{i:05d}" for i in range(30)
    ]
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "- **prompts**: left out (`--no-prompts`)" in card and "| `prompt` |" not in card
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(tmp_path / "ds2")])
    assert result.exit_code == 0 and "prompts in `prompt`" in result.stdout


def test_a_messages_column_is_exported_as_the_input_holds_it(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path, prompt_column=None, messages_column="messages")
    r = export_dataset(out, tmp_path / "ds")
    got = exported(tmp_path / "ds")
    assert r.prompt_column == "messages" and "prompt" not in got.column_names
    assert (
        got.schema.field("messages").type
        == pq.read_schema(tmp_path / "in.parquet").field("messages").type
    )
    assert got.column("messages").to_pylist() == [messages(i) for i in range(30)]
    card = (tmp_path / "ds" / "README.md").read_text()
    want = "| `messages` | `list<struct<role: string, content: string>>` | the chat, as the input"
    assert want in card


def test_a_prompt_column_passed_through_is_exported_once(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path, passthrough_columns=["prompt"])
    for prompts in (True, False):  # a pass-through column stays, with or without prompts
        dest = tmp_path / f"ds-{prompts}"
        assert export_dataset(out, dest, prompts=prompts).prompt_column == "prompt"
        got = exported(dest)
        assert got.column_names.count("prompt") == 1
        assert got.column("prompt").to_pylist() == [prompt(i) for i in range(30)]


def test_a_prompt_column_named_like_an_output_column_is_refused(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path, prompt_column="id")
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(tmp_path / "ds")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "prompt column 'id'" in result.stderr and "--no-prompts" in result.stderr


def test_the_card_explains_every_column_and_null_acceptance(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    export_dataset(out, tmp_path / "ds")
    card = (tmp_path / "ds" / "README.md").read_text()
    schema = exported(tmp_path / "ds").schema
    lines = {line.split(" | ")[0][3:-1]: line for line in card.splitlines() if line[:3] == "| `"}
    for f in schema:
        _, typ, meaning = lines[f.name].strip("| ").split(" | ")
        assert typ == f"`{type_name(f.type)}`" and len(meaning) > 15, lines[f.name]
        assert "not described" not in meaning
    assert set(COLUMN_DOCS) == {f.name for f in RESULT_FIELDS}
    assert "the prompt, as the input's `prompt` column holds it" in lines["prompt"]
    assert "| `acceptance_histogram` | `list<int32>` |" in card
    assert "| `acceptance_rate` | `float64` |" in card
    chat = pa.large_list(pa.struct([("role", pa.large_string()), ("content", pa.string_view())]))
    assert type_name(chat) == "list<struct<role: string, content: string>>"  # polars' input
    unmeasured = sum(1 for i in range(30) if i % 11 != 5 and (i % 3 == 0 or i % 5 == 0))
    assert f"In this dataset {unmeasured} row(s) with a generation have no" in card
    assert "K = 0" in card and "before any step drafted" in card


def test_conform_is_the_rule_for_parts_of_other_versions() -> None:
    schema = pa.schema([("a", pa.int32()), ("b", pa.list_(pa.int32())), ("c", pa.string())])
    part = pa.table({"a": pa.array([1, 2], pa.int64()), "z": ["x", "y"], "c": ["p", None]})
    got = conform(part, schema)
    assert got.schema == schema and got.column_names == ["a", "b", "c"]
    assert got.to_pylist() == [{"a": 1, "b": None, "c": "p"}, {"a": 2, "b": None, "c": None}]
    with pytest.raises(ValueError, match="column 'a' is string, not int32"):
        conform(pa.table({"a": ["four"]}), schema)


def test_parts_written_before_a_column_existed_still_report_and_export(tmp_path: Path) -> None:
    """An old part without three of today's columns (``engine`` among them: parts before
    batchspec recorded it) and a newer one with a column unknown today, a wider int and rows
    from the other engine, among normal parts: report and export work, nulls where columns
    were missing, the unknown column left out."""
    out = synthetic_run(tmp_path)
    parts = out.part_files()
    old, new = pq.read_table(parts[1]), pq.read_table(parts[4])
    assert old.column("acceptance_rate").null_count < len(old)  # nulls below come from the rule
    assert old.column("engine").null_count < len(old)
    missing = ["acceptance_rate", "num_speculative_tokens", "engine"]
    pq.write_table(old.drop_columns(missing), parts[1])
    at = new.schema.get_field_index("num_output_tokens")
    wide = new.column(at).cast(pa.int64())
    new = new.set_column(at, "num_output_tokens", wide).append_column(
        "from_the_future", pa.array(["x"] * new.num_rows)
    )
    ran = pa.array([None if e is None else "tree" for e in new.column("engine").to_pylist()])
    new = new.set_column(new.schema.get_field_index("engine"), "engine", ran.cast(pa.string()))
    pq.write_table(new, parts[4])
    result = CliRunner().invoke(main, ["report", str(out)])
    assert result.exit_code == 0 and "30 rows committed" in result.stdout, result.output
    assert "tree,vllm" in result.stdout  # a domain whose rows ran on both engines says so
    for per_scan in (1, 3, 256):  # the old part alone in a batch, and mixed with others
        table = table_of(scan_output(out, per_scan=per_scan))
        assert (table["rows"].sum(), table["errors"].sum()) == (30, 3)
        assert table["output_tokens"].sum() == 4 * 27
        assert table["k_used"].to_list() == [[0, 3]] * 3
        both = table.filter(pl.col("domain") == new.column("domain")[0].as_py())
        assert both["engines"].to_list() == [["tree", "vllm"]]
    export_dataset(out, tmp_path / "ds")
    got = exported(tmp_path / "ds")
    assert "from_the_future" not in got.column_names
    assert got.schema.field("num_output_tokens").type == pa.int32()
    assert got.column("id").to_pylist() == [f"r{i:05d}" for i in range(30)]
    rows = {r["id"]: r for r in got.to_pylist()}
    for r in old.to_pylist():
        assert rows[r["id"]]["acceptance_rate"] is None is rows[r["id"]]["num_speculative_tokens"]
        assert rows[r["id"]]["engine"] is None
        assert rows[r["id"]]["generated_text"] == r["generated_text"]
    for r in new.to_pylist():
        assert rows[r["id"]]["acceptance_rate"] == r["acceptance_rate"]
        assert rows[r["id"]]["engine"] == r["engine"]
    assert {r["engine"] for r in rows.values()} == {None, "tree", "vllm"}


def test_todays_parts_are_scanned_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The part-by-part path is for parts of other versions only: it is 4x slower."""
    out = synthetic_run(tmp_path)

    def one_by_one(path: Path, schema: pa.Schema) -> pa.Table:
        raise AssertionError(f"{path} read alone")

    monkeypatch.setattr(scan, "read_part", one_by_one)
    assert table_of(scan_output(out, extras=True))["rows"].sum() == 30


def test_a_part_whose_column_will_not_convert_is_named(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    part = out.part_files()[2]
    table = pq.read_table(part)
    at = table.schema.get_field_index("num_output_tokens")
    pq.write_table(table.set_column(at, "num_output_tokens", pa.array(["four"] * len(table))), part)
    for args in (["report", str(out)], ["export", str(out), "--to", str(tmp_path / "ds")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert part.name in result.stderr and "'num_output_tokens' is string" in result.stderr


def unit_result(domain: str, rows: int, k: int = 3) -> UnitResult:
    unit = WorkUnit(0, "in", 0, rows, domain, rows)
    reqs = [RowRequest(i, f"{domain}{i}", domain, {}) for i in range(rows)]
    spec = SpecStats(steps=4, drafted=12, accepted=6, histogram=(0, 2, 2, 0))
    results = [RowResult(r, "t", 3, 10, "stop", spec) for r in reqs]
    return UnitResult(UnitRequests(unit, reqs), results, k, "ngram", VLLM)


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


def leased_run(tmp: Path) -> tuple[OutDir, list[Path]]:
    """A synthetic run with two units left: one leased by a live worker (one row finished),
    one pending; and the parts it had before."""
    out = synthetic_run(tmp)
    parts = out.part_files()
    for p in parts[:2]:
        p.unlink()
    leases = Leases(out, "w1", 60, 1)
    leases.try_claim(parts[0].stem)
    log = ProgressLog(out, "w1", "run", leases)  # its record is its heartbeat (leases/)
    log.watch(lambda: [UnitRequests(WorkUnit(0, "in", 0, 4, "a", 2), finished=1)], 3)
    log.write()
    return out, parts


def test_status_json_while_units_are_leased(tmp_path: Path) -> None:
    out, parts = leased_run(tmp_path)
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


def test_the_docs_status_example_while_a_run_goes_is_what_status_prints(tmp_path: Path) -> None:
    """operations.md's example of ``status`` during a run, line shape for line shape (numbers,
    names and paths aside; a domain's line may go on with the K controller's view, which this
    run has none of). After a run: ``test_observe_run``."""
    result = CliRunner().invoke(main, ["status", str(leased_run(tmp_path)[0])])
    real = shapes(result.stdout.splitlines())
    running = [b for b in status_examples() if b[0].endswith(": running")]
    assert running
    for block in running:
        example = shapes(block)
        assert set(example) == set(real), block
        for kind in set(real) - {"domain"}:
            assert example[kind] == real[kind], (kind, example[kind], real[kind])
        for line in example["domain"]:
            assert any(line.startswith(want) for want in real["domain"]), (line, real["domain"])


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
