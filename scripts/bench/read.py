"""Reading work units from an input whose row groups are far larger than a unit, in a fresh
process: a 1M-row Parquet input of ~1 KB prompts in one row group, staged once, then random
units read and built (a no-op tokenizer), then every unit. Targets for 256-row units: read
p50 <= 20 ms, p99 <= 40 ms, peak RSS <= 500 MB. The last line is ``per-unit read p50 X ms,
p99 Y ms, peak RSS Z MB``.

    .venv/bin/python scripts/bench/read.py [--rows 1000000] [--row-group-size N] [--dir /tmp/x]
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from pathlib import Path

from harness import fresh, header, parser, percentile, workdir
from synthetic import DOMAINS, write_input

PROMPT_BYTES = 1024


class NoTokenizer:
    """A tokenizer that costs nothing, so that building requests times the reading only."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [len(text)]}


def measure(input_path: str, out_dir: str, unit_rows: int, sample: int) -> dict:
    """Plan, stage, read a spread, build it, read everything (milliseconds per unit)."""
    from batchspec.io.inputs import PromptBuilder
    from batchspec.io.layout import OutDir
    from batchspec.io.planner import plan_units
    from batchspec.io.reader import UnitReader
    from batchspec.spec import InputSpec

    spec = InputSpec(path=input_path, id_column="id", prompt_column="prompt",
                     domain_column="domain", apply_chat_template=False)  # fmt: skip
    started = time.perf_counter()
    units = plan_units([Path(input_path)], unit_rows, "domain")
    plan_s = time.perf_counter() - started
    reader = UnitReader(spec, unit_rows, units)
    stage_s = reader.stage(OutDir(Path(out_dir)), units)
    spread = random.Random(0).sample(units, min(sample, len(units)))
    builder = PromptBuilder(spec, NoTokenizer(), 1 << 30, 0, reader)
    times, built = [], []
    for unit, into in [(u, times) for u in spread] + [(u, built) for u in spread]:
        t0 = time.perf_counter()
        got = reader.read(unit).num_rows if into is times else len(builder.build(unit).rows)
        into.append((time.perf_counter() - t0) * 1000)
        assert got == unit.num_rows
    t0 = time.perf_counter()
    rows = sum(reader.read(unit).num_rows for unit in units)
    return {"units": len(units), "plan_s": plan_s, "stage_s": stage_s, "sample": len(spread),
            "files_staged": reader.files_staged, "all_s": time.perf_counter() - t0, "rows": rows,
            "p50": percentile(times, 0.5), "p99": percentile(times, 0.99), "max": max(times),
            "build_p50": percentile(built, 0.5), "build_p99": percentile(built, 0.99)}  # fmt: skip


def report(r: dict, unit_rows: int, staged_mb: float) -> None:
    print(f"plan: {r['units']:,} units of up to {unit_rows} rows in {r['plan_s']:.1f} s")
    print(f"staging (once per input file and output directory, reused by every worker and "
          f"rerun): {r['files_staged']} file(s) in {r['stage_s']:.1f} s, {staged_mb:,.0f} MB "
          f"staged")  # fmt: skip
    print(f"read {r['sample']} units in random order: p50 {r['p50']:.2f} ms, p99 "
          f"{r['p99']:.2f} ms, max {r['max']:.2f} ms")  # fmt: skip
    print(f"PromptBuilder.build of the same units (read, rows to Python, seeds; a no-op "
          f"tokenizer): p50 {r['build_p50']:.2f} ms, p99 {r['build_p99']:.2f} ms")  # fmt: skip
    print(f"read all {r['units']:,} units ({r['rows']:,} rows) in {r['all_s']:.1f} s: "
          f"{1e6 * r['all_s'] / r['rows']:.1f} us per row")  # fmt: skip
    ok = r["p50"] <= 20 and r["p99"] <= 40 and r["peak_mb"] <= 500
    print(f"targets p50 <= 20 ms, p99 <= 40 ms, peak RSS <= 500 MB: {'ok' if ok else 'MISSED'}")
    print(f"per-unit read p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, peak RSS "
          f"{r['peak_mb']:.0f} MB")  # fmt: skip


def main() -> None:
    # --row-group-size: 0 is pyarrow's (1M rows); --sample: units read one by one, timed;
    # --dir: kept (default: a temporary one, removed after).
    ap = parser(__doc__, rows=1_000_000, unit_rows=256, row_group_size=0, sample=1000, dir=None)
    args = ap.parse_args()
    header()
    with workdir(args.dir, "bench_read-") as work:
        need_gb = 2.5 * args.rows * PROMPT_BYTES / 1e9  # input + staged copy, with headroom
        if shutil.disk_usage(work).free / 1e9 < need_gb:
            sys.exit(f"{work}: less than {need_gb:.1f} GB free; use --rows")
        path, started = work / "input.parquet", time.perf_counter()
        write_input(path, args.rows, PROMPT_BYTES, args.row_group_size or None)
        print(f"input: {args.rows:,} rows of ~{PROMPT_BYTES} B prompts, {len(DOMAINS)} "
              f"interleaved domains, row groups of {args.row_group_size or 'up to 1M'} rows, "
              f"{path.stat().st_size / 1e6:,.0f} MB (written in "
              f"{time.perf_counter() - started:.1f} s)")  # fmt: skip
        r = fresh(measure, str(path), str(work / "out"), args.unit_rows, args.sample)
        staged = sum(f.stat().st_size for f in (work / "out").rglob("*.parquet")) / 1e6
        report(r, args.unit_rows, staged)


if __name__ == "__main__":
    main()
