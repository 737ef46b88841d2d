"""Unit reads through staged copies: the same rows as a direct read, one copy per input,
reused by every reader, never seen half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.io.inputs import PromptBuilder, row_seed
from batchspec.io.layout import OutDir
from batchspec.io.planner import plan_units
from batchspec.io.reader import UnitReader, read_unit_table
from batchspec.spec import InputSpec

ROOT = Path(__file__).resolve().parents[1]
SPEC = InputSpec(path="x", prompt_column="prompt", domain_column="domain")
COLUMNS = ["id", "prompt", "domain"]


def make_input(path: Path, n: int, row_group_size: int, domains: list | None = None) -> Path:
    domains = domains or ["x", "y", None, "z"]
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(n)],
            "domain": [domains[(i * 7 // 3) % len(domains)] for i in range(n)],
            "prompt": [f"prompt {i} " * (i % 5) for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def staged(out: OutDir, spec: InputSpec, unit_rows: int, units: list) -> UnitReader:
    reader = UnitReader(spec, unit_rows, units)
    reader.stage(out, units)
    return reader


@pytest.mark.parametrize(
    ("n", "group", "unit_rows", "limit"),
    [(1000, 1000, 8, None), (1003, 300, 10, None), (1000, 1000, 16, 517)],
)
def test_staged_reads_give_exactly_the_direct_rows(
    tmp_path: Path, n: int, group: int, unit_rows: int, limit: int | None
) -> None:
    f = make_input(tmp_path / "in.parquet", n, group)
    units = plan_units([f], unit_rows, "domain", limit)
    reader = staged(OutDir(tmp_path / "out"), SPEC, unit_rows, units)
    assert reader.files_staged == 1
    (copy,) = (tmp_path / "out" / "staged").iterdir()
    assert sum(pq.ParquetFile(s).num_row_groups for s in copy.iterdir()) == len(units)
    for unit in units:
        got = reader.read(unit)
        assert got.equals(read_unit_table(unit, COLUMNS, "domain")), unit
        assert got.num_rows == unit.num_rows


def test_without_domain_column_and_non_string_domains(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 300, 300, domains=[1, 2, None])
    plain = InputSpec(path="x", prompt_column="prompt")
    for spec, dom in ((plain, None), (SPEC, "domain")):
        units = plan_units([f], 8, dom)
        reader = staged(OutDir(tmp_path / f"out-{dom}"), spec, 8, units)
        cols = ["id", "prompt", "domain"] if dom else ["id", "prompt"]
        for unit in units:
            assert reader.read(unit).equals(read_unit_table(unit, cols, dom))


def test_small_row_groups_are_read_directly(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 200, 32, domains=["x"])
    units = plan_units([f], 8, "domain")
    reader = staged(OutDir(tmp_path / "out"), SPEC, 8, units)
    assert reader.files_staged == 0 and not (tmp_path / "out" / "staged").exists()
    assert reader.read(units[3]).equals(read_unit_table(units[3], COLUMNS, "domain"))


def test_interleaved_domains_stage_groups_of_two_chunks(tmp_path: Path) -> None:
    # Every 8-row chunk holds 4 domains' units of ~2 rows: read directly, each of them would
    # decode 16 rows for its 2, so the file is staged though its groups are two units long.
    f = make_input(tmp_path / "in.parquet", 200, 16)
    units = plan_units([f], 8, "domain")
    assert staged(OutDir(tmp_path / "out"), SPEC, 8, units).files_staged == 1


def test_copy_is_reused_by_later_readers_and_remade_for_a_changed_input(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 400, 400)
    out = OutDir(tmp_path / "out")
    units = plan_units([f], 8, "domain")
    first = staged(out, SPEC, 8, units)
    (copy,) = out.staged.iterdir()
    mtime = copy.stat().st_mtime_ns
    again = staged(out, SPEC, 8, units)
    assert (first.files_staged, again.files_staged) == (1, 0)
    assert [p.name for p in out.staged.iterdir()] == [copy.name]
    assert copy.stat().st_mtime_ns == mtime
    make_input(f, 401, 401)  # a changed input: its old copy must not be read
    units = plan_units([f], 8, "domain")
    changed = staged(out, SPEC, 8, units)
    assert changed.files_staged == 1 and len(list(out.staged.iterdir())) == 2
    assert changed.read(units[-1]).equals(read_unit_table(units[-1], COLUMNS, "domain"))


def test_concurrent_readers_stage_once(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 3000, 3000)
    out = OutDir(tmp_path / "out")
    units = plan_units([f], 8, "domain")
    readers = [UnitReader(SPEC, 8, units) for _ in range(4)]
    threads = [threading.Thread(target=r.stage, args=(out, units)) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.files_staged for r in readers) == 1
    assert [p.suffix for p in out.staged.iterdir()] == [""]  # the copy; no lock, no temporary
    for r in readers:
        assert r.read(units[100]).equals(read_unit_table(units[100], COLUMNS, "domain"))


CHILD = """
import os, sys, time
from pathlib import Path
from batchspec.io import staging
from batchspec.io.layout import OutDir
from batchspec.io.planner import plan_units
from batchspec.io.reader import UnitReader
from batchspec.spec import InputSpec

close = staging._ShardWriter.close
def slow_close(self):
    close(self)
    print("shard", flush=True)
    time.sleep(60)
staging._ShardWriter.close = slow_close
units = plan_units([Path(sys.argv[1])], 8, "domain")
spec = InputSpec(path="x", prompt_column="prompt", domain_column="domain")
UnitReader(spec, 8, units).stage(OutDir(sys.argv[2]), units)
"""


def test_kill_mid_staging_leaves_no_copy_and_the_next_reader_stages(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 3000, 3000)
    out = OutDir(tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(f), str(out.root)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None and child.stdout.readline() == "shard\n"
    os.kill(child.pid, signal.SIGKILL)  # one shard written, the copy unfinished
    child.wait()
    left = sorted(p.name for p in out.staged.iterdir())
    assert len(left) == 2 and left[0].startswith(".") and left[1].endswith(".lock"), left
    units = plan_units([f], 8, "domain")
    reader = staged(out, SPEC, 8, units)  # the dead stager's lock is taken over
    assert reader.files_staged == 1
    assert [p.name for p in out.staged.iterdir()] == [left[1][: -len(".lock")]]
    for unit in units[::37]:
        assert reader.read(unit).equals(read_unit_table(unit, COLUMNS, "domain"))


def test_row_seeds_of_neighbouring_seeds_do_not_collide() -> None:
    seeds = [row_seed(s, f, r) for s in range(8) for f in range(2) for r in range(2000)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 1 << 63 for s in seeds)
    # The old scheme (seed + (file << 40) + row) gave seed s row i+1 == seed s+1 row i.
    assert row_seed(0, 0, 1) != row_seed(1, 0, 0)
    assert row_seed(5, 1, 7) == row_seed(5, 1, 7)


class CharTokenizer:
    """Stands in for a tokenizer: one token per character (the test is about rows, not text)."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_prompt_builder_reads_through_the_staged_copy(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 600, 600)
    spec = InputSpec(path="x", prompt_column="prompt", domain_column="domain")
    spec = spec.model_copy(update={"apply_chat_template": False})
    units = plan_units([f], 16, "domain")
    reader = staged(OutDir(tmp_path / "out"), spec, 16, units)
    via_copy = PromptBuilder(spec, CharTokenizer(), 10_000, 7, reader)
    direct = PromptBuilder(spec, CharTokenizer(), 10_000, 7)
    with_seed_8 = PromptBuilder(spec, CharTokenizer(), 10_000, 8)
    for unit in units[::5]:
        assert via_copy.build(unit).rows == direct.build(unit).rows
    seeds = [{r.seed for u in units for r in b.build(u).rows} for b in (direct, with_seed_8)]
    assert len(seeds[0]) == len(seeds[1]) == 600 and not seeds[0] & seeds[1]
