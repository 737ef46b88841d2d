"""Benchmark: reading work units from an input whose row groups are far larger than a unit.

Builds a Parquet input of ``--rows`` rows (default 1M) with ~1 KB incompressible prompts,
6 interleaved domains, written with pyarrow's defaults (one row group of up to 1M rows), plans
it with the product's planner, then, in a fresh process (for its peak RSS), reads it the way a
worker does: ``UnitReader.stage`` (the one-time staging, timed apart) and ``UnitReader.read``
(what ``PromptBuilder.build`` calls for each unit) for a random spread of units, the same
units through ``PromptBuilder.build`` with a no-op tokenizer, then every unit. Targets for
256-row units: per-unit read p50 <= 20 ms, p99 <= 40 ms, peak RSS <= 500 MB. The last line
is ``per-unit read p50 X ms, p99 Y ms, peak RSS Z MB``.

    .venv/bin/python scripts/bench_read.py [--rows 1000000] [--unit-rows 256]
        [--row-group-size N] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAINS = ["chat", "code", "math", "qa", "summarization", "translation"]
PROMPT_BYTES = 1024


def build_input(path: Path, rows: int, row_group_size: int | None) -> float:
    """Write the input (pyarrow's defaults unless ``row_group_size``); returns seconds taken."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    started = time.perf_counter()
    data = base64.b64encode(os.urandom(rows * PROMPT_BYTES * 3 // 4))  # incompressible text
    offsets = pa.py_buffer((np.arange(rows + 1, dtype=np.int32) * PROMPT_BYTES).tobytes())
    prompts = pa.StringArray.from_buffers(rows, offsets, pa.py_buffer(data))
    codes = pa.array(np.arange(rows, dtype=np.int32) % len(DOMAINS))
    domain = pa.DictionaryArray.from_arrays(codes, pa.array(DOMAINS)).cast(pa.string())
    ids = pa.array([f"r{i}" for i in range(rows)])
    table = pa.table({"id": ids, "domain": domain, "prompt": prompts})
    pq.write_table(table, path, row_group_size=row_group_size)
    return time.perf_counter() - started


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: on Linux ru_maxrss survives exec, so a
    child forked from a parent holding the input would report the parent's size."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class NoTokenizer:
    """A tokenizer that costs nothing, so that building requests times the reading only."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [len(text)]}


def child(input_path: Path, out_dir: Path, unit_rows: int, sample: int) -> dict:
    """The measurement, in a fresh process: plan, stage, read a spread, read everything."""
    from batchspec.io.inputs import PromptBuilder
    from batchspec.io.layout import OutDir
    from batchspec.io.planner import plan_units
    from batchspec.io.reader import UnitReader
    from batchspec.spec import InputSpec

    spec = InputSpec(
        path=str(input_path),
        id_column="id",
        prompt_column="prompt",
        domain_column="domain",
        apply_chat_template=False,
    )
    started = time.perf_counter()
    units = plan_units([input_path], unit_rows, "domain")
    plan_s = time.perf_counter() - started
    reader = UnitReader(spec, unit_rows, units)
    stage_s = reader.stage(OutDir(out_dir), units)
    spread = random.Random(0).sample(units, min(sample, len(units)))
    times = []
    for unit in spread:
        t0 = time.perf_counter()
        table = reader.read(unit)
        times.append((time.perf_counter() - t0) * 1000)
        assert table.num_rows == unit.num_rows
    builder = PromptBuilder(spec, NoTokenizer(), 1 << 30, 0, reader)
    built = []
    for unit in spread:
        t0 = time.perf_counter()
        assert len(builder.build(unit).rows) == unit.num_rows
        built.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    rows = sum(reader.read(unit).num_rows for unit in units)
    all_s = time.perf_counter() - t0
    return {
        "units": len(units),
        "plan_s": plan_s,
        "stage_s": stage_s,
        "files_staged": reader.files_staged,
        "sample": len(spread),
        "p50": percentile(times, 0.5),
        "p99": percentile(times, 0.99),
        "max": max(times),
        "build_p50": percentile(built, 0.5),
        "build_p99": percentile(built, 0.99),
        "all_s": all_s,
        "rows": rows,
        "rss_mb": peak_rss_mb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--unit-rows", type=int, default=256)
    ap.add_argument("--row-group-size", type=int, help="default: pyarrow's (1M rows)")
    ap.add_argument("--sample", type=int, default=1000, help="units read one by one, timed")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = child(Path(args.child[0]), Path(args.child[1]), args.unit_rows, args.sample)
        print(json.dumps(result))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_read-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(work, args)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    free_gb = shutil.disk_usage(work).free / 1e9
    need_gb = 2.5 * args.rows * PROMPT_BYTES / 1e9  # input + staged copy, with headroom
    if free_gb < need_gb:
        sys.exit(f"{work}: {free_gb:.1f} GB free, need about {need_gb:.1f} GB; use --rows")
    path = work / "input.parquet"
    build_s = build_input(path, args.rows, args.row_group_size)
    meta = pq.ParquetFile(path).metadata
    print(
        f"input: {args.rows:,} rows of ~{PROMPT_BYTES} B prompts, {len(DOMAINS)} interleaved "
        f"domains, {meta.num_row_groups} row group(s) of up to "
        f"{max(meta.row_group(g).num_rows for g in range(meta.num_row_groups)):,} rows, "
        f"{path.stat().st_size / 1e6:,.0f} MB (written in {build_s:.1f} s)"
    )
    cmd = [sys.executable, __file__, "--child", str(path), str(work / "out")]
    cmd += ["--unit-rows", str(args.unit_rows), "--sample", str(args.sample)]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    staged = sum(f.stat().st_size for f in (work / "out").rglob("*.parquet")) / 1e6
    print(f"plan: {r['units']:,} units of up to {args.unit_rows} rows in {r['plan_s']:.1f} s")
    print(
        f"staging (once per input file and output directory, reused by every worker and "
        f"rerun): {r['files_staged']} file(s) in {r['stage_s']:.1f} s, {staged:,.0f} MB staged"
    )
    print(
        f"read {r['sample']} units in random order: p50 {r['p50']:.2f} ms, p99 "
        f"{r['p99']:.2f} ms, max {r['max']:.2f} ms"
    )
    print(
        f"PromptBuilder.build of the same units (read, rows to Python, seeds; a no-op "
        f"tokenizer): p50 {r['build_p50']:.2f} ms, p99 {r['build_p99']:.2f} ms"
    )
    print(
        f"read all {r['units']:,} units ({r['rows']:,} rows) in {r['all_s']:.1f} s: "
        f"{1e6 * r['all_s'] / r['rows']:.1f} us per row"
    )
    ok = r["p50"] <= 20 and r["p99"] <= 40 and r["rss_mb"] <= 500
    print(f"targets p50 <= 20 ms, p99 <= 40 ms, peak RSS <= 500 MB: {'ok' if ok else 'MISSED'}")
    print(
        f"per-unit read p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, peak RSS {r['rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
