"""A large JSONL input staged into Parquet once, then planned and read per unit, each step in a
fresh process for its peak RSS (issue 37: staging linear with bounded memory; per-unit read
p50 <= 20 ms, peak <= 500 MB). The last line: ``staged N lines in S s (R lines/s), peak RSS
M MB; ...``.

    .venv/bin/python scripts/bench/stage.py [--rows 10000000] [--prompt-bytes 256] [--dir /tmp/x]
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from harness import fresh, header, parser, percentile, workdir
from synthetic import write_lines


def measure(work: str, unit_rows: int, units_read: int, read: bool) -> dict:
    """Staging (then, with ``read``, planning and reads) of ``work/in.jsonl``."""
    from batchspec.io.convert import Staging, staged_files
    from batchspec.io.ids import check_ids
    from batchspec.io.layout import OutDir
    from batchspec.io.planner import plan_units
    from batchspec.io.reader import UnitReader, required_columns
    from batchspec.io.sources import Source
    from batchspec.spec import InputSpec
    from batchspec.spec.sampling import SamplingSpec

    spec = InputSpec(path="in.jsonl", format="jsonl", prompt_column="prompt",
                     domain_column="domain")  # fmt: skip
    how = Staging(spec, SamplingSpec(), unit_rows, required_columns(spec))
    out, started = OutDir(Path(work) / "out"), time.perf_counter()
    files, _ = staged_files(out, [Source(Path(work) / "in.jsonl", "jsonl")], how)
    result: dict = {"seconds": time.perf_counter() - started, "files": len(files)}
    if not read:
        return result
    started = time.perf_counter()
    units = plan_units(files, unit_rows, "domain")
    check_ids(files, "id")
    result["plan_s"] = time.perf_counter() - started
    reader = UnitReader(spec, unit_rows, units)
    result["restage_s"] = reader.stage(out, units)
    times = []
    for unit in random.Random(0).sample(units, min(units_read, len(units))):
        t = time.perf_counter()
        assert reader.read(unit).num_rows == unit.num_rows
        times.append((time.perf_counter() - t) * 1e3)
    return result | {"units": len(units), "p50_ms": percentile(times, 0.5),
                     "p99_ms": percentile(times, 0.99)}  # fmt: skip


def main() -> None:
    # --units: units read for the latencies; --dir: kept (default: a temporary one, removed).
    ap = parser(__doc__, rows=10_000_000, prompt_bytes=256, unit_rows=256, units=300, dir=None)
    args = ap.parse_args()
    header()
    with workdir(args.dir, "bench_stage-") as work:
        started = time.perf_counter()
        write_lines(work / "in.jsonl", args.rows, args.prompt_bytes)
        size = (work / "in.jsonl").stat().st_size / 1e9
        print(f"input: {args.rows} lines, {size:.2f} GB, written in "
              f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
        st = fresh(measure, str(work), args.unit_rows, args.units, False)
        print(f"stage: {st}", flush=True)
        rd = fresh(measure, str(work), args.unit_rows, args.units, True)
        print(f"read: {rd}", flush=True)
        print(f"staged {args.rows} lines in {st['seconds']:.1f} s "
              f"({args.rows / st['seconds']:,.0f} lines/s), peak RSS {st['peak_mb']:.0f} MB; "
              f"plan + id check {rd['plan_s']:.1f} s; row-group staging {rd['restage_s']:.1f} s;"
              f" per-unit read p50 {rd['p50_ms']:.1f} ms, p99 {rd['p99_ms']:.1f} ms, "
              f"peak RSS {rd['peak_mb']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
