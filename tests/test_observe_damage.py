"""Damaged output directories and impossible destinations: ``status``, ``report``, ``export``
and ``slurm status`` refuse them in one line (exit 2, no traceback) and write nothing; and
``status --require-complete`` gives the run's verdict as its exit code. Output directories
are synthetic (``test_observe_units.synthetic_run``): no engine runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli_errors import assert_user_error, cli
from test_observe_units import SCHEMA, synthetic_run

from batchspec.io.layout import OutDir
from batchspec.observe.shards import ShardWriter

LOOKERS = [
    "status {out}",
    "status {out} --json",
    "slurm status {out}",
    "status {out} --require-complete",
    "report {out}",
]
"""The commands that read an output directory (``export``: below)."""


def look(words: str, out: OutDir, *more: str):
    return cli(*words.format(out=out.root).split(), *more)


def set_errors(out: OutDir, error: str | None) -> None:
    """Every row of every part an error row (``error``), or none (None)."""
    for part in out.part_files():
        table = pq.read_table(part)
        at = table.schema.get_field_index("error")
        column = pa.array([error] * table.num_rows, pa.string())
        pq.write_table(table.set_column(at, table.schema.field(at), column), part)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_part_of_random_bytes_is_named_by_every_command(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    part = out.part_files()[1]
    part.write_bytes(os.urandom(3000))
    before = listing(tmp_path)
    for words in LOOKERS:
        assert_user_error(look(words, out), str(part))
    assert_user_error(cli("export", str(out.root), "--to", str(tmp_path / "ds")), str(part))
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    ("dest", "said"),
    [
        ("/proc/bsx", "--to /proc/bsx: cannot be created in /proc (No such file or directory)"),
        ("{tmp}/in.parquet/x", "--to {tmp}/in.parquet/x: lies under {tmp}/in.parquet, which is"),
    ],
)
def test_a_destination_that_cannot_be_made_is_refused_first(
    tmp_path: Path, dest: str, said: str
) -> None:
    out = synthetic_run(tmp_path)
    out.job_record.write_text("{")  # checked after the destination: not reached
    before = listing(tmp_path)
    result = cli("export", str(out.root), "--to", dest.format(tmp=tmp_path))
    assert_user_error(result, said.format(tmp=tmp_path))
    assert listing(tmp_path) == before and not Path("/proc/bsx").exists()


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ("{not json", "job.json: not a readable job record (Expecting property name"),
        ("[]", "job.json: not a job record of batchspec run (input_files missing)"),
        (
            {"input_files": ["x"], "limit": None, "spec": {"input": {}}},
            "job.json: not a job record of batchspec run (spec.input.id_column missing)",
        ),
        ("unit_rows", "job.json: spec.output.unit_rows is 'four'; expected int"),
    ],
)
def test_a_damaged_job_record_is_refused_by_export(tmp_path: Path, record, said: str) -> None:
    out = synthetic_run(tmp_path)
    if record == "unit_rows":
        record = json.loads(out.job_record.read_text())
        record["spec"]["output"]["unit_rows"] = "four"
    out.job_record.write_text(record if isinstance(record, str) else json.dumps(record))
    result = cli("export", str(out.root), "--to", str(tmp_path / "ds"))
    assert_user_error(result, said)
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds*"))
    for words in LOOKERS:  # they do not need the record
        assert look(words, out).returncode in (0, 4), words


def test_drop_errors_when_every_row_is_an_error_row_is_refused(tmp_path: Path) -> None:
    """The choice: nothing left to export is refused, as an output with nothing committed
    is; not an empty dataset a pipeline would take for a result."""
    out = synthetic_run(tmp_path)
    set_errors(out, "prompt is empty")
    dest = tmp_path / "ds"
    result = cli("export", str(out.root), "--to", str(dest), "--drop-errors")
    assert_user_error(result, "every committed row is an error row (30)", "--drop-errors")
    assert not dest.exists() and not list(tmp_path.glob(".ds*"))
    kept = cli("export", str(out.root), "--to", str(dest))
    assert kept.returncode == 0 and "exported 30 rows" in kept.stdout, kept.stderr


def test_a_shard_writer_given_an_empty_chunk_last_writes_no_empty_row_group(
    tmp_path: Path,
) -> None:
    """A last chunk whose rows were all dropped (``--drop-errors``) after a row group was
    written: Parquet refuses a row group of 0 rows."""
    rows = pa.Table.from_pylist([{"id": "a", "domain": "d", "unit_id": "u"}], SCHEMA)
    writer = ShardWriter(tmp_path, SCHEMA, shard_bytes=1 << 20, group_bytes=1)
    writer.write(rows)
    writer.write(rows.slice(0, 0))
    shards = writer.close()
    assert [pq.read_metadata(p).num_rows for p in shards] == [1]


def test_a_damaged_slurm_job_record_is_named(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    out.slurm.mkdir()
    out.slurm_jobs.write_text('{"job_id": "5", "tasks": 2}\n{"job_id": \n')
    for words in LOOKERS[:4]:
        assert_user_error(look(words, out), f"{out.slurm_jobs}: line 2 is not a job record")


def verdict(out: OutDir, *flags: str) -> tuple[int, str]:
    result = look("status {out} --require-complete", out, *flags)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()[-1]


def test_require_complete_exits_with_the_verdict(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    n = len(out.part_files())
    assert verdict(out) == (4, f"complete with 3 error rows: {n}/{n} units committed "
                               "(exit 4; `run --retry-errors` generates them again)")  # fmt: skip
    set_errors(out, None)
    assert verdict(out) == (0, f"complete: {n}/{n} units committed, no error rows")
    assert look("slurm status {out} --require-complete", out).returncode == 0
    gone = out.part_files()[0]
    gone.unlink()
    code, line = verdict(out)
    assert code == 5 and line.startswith(f"incomplete: {n - 1}/{n} units committed"), line
    out.failed.mkdir()
    out.failure(gone.stem).write_text("{}")
    code, line = verdict(out)
    assert code == 3 and "1 failed" in line, line
    as_json = look("status {out} --json --require-complete", out)
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["units"]["failed"] == 1
    assert as_json.stderr.startswith("incomplete:"), as_json.stderr
    plain = look("status {out}", out)
    assert plain.returncode == 0 and "incomplete" not in plain.stdout


def test_require_complete_on_a_directory_no_run_has_bound_is_incomplete(tmp_path: Path) -> None:
    out = OutDir(tmp_path / "out")
    out.root.mkdir()
    out.tuning.write_text("{}")
    assert verdict(out) == (5, f"incomplete: no run has bound {out} yet (exit 5)")
