"""Planning a large input: time and peak memory of turning 10,000,000 rows into work units.

Writes a synthetic Parquet input (ids, six interleaved domains, short prompts) once, then plans
it in a fresh process (so peak RSS is the planner's own) with and without a domain column.
Targets: under 60 s and under 500 MB peak RSS.

    .venv/bin/python scripts/bench_plan.py                 # 10M rows, unit_rows 256
    .venv/bin/python scripts/bench_plan.py --rows 1000000 --unit-rows 1024
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAINS = ["chat", "code", "math", "translation", "summarization", "qa"]


def write_input(path: Path, rows: int, row_group: int = 1_000_000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, rows, row_group):
            n = min(row_group, rows - start)
            ids = pa.array([f"row-{i:09d}" for i in range(start, start + n)])
            # Runs of 100 rows per domain: mixed like a real concatenation of sources.
            dom = pa.array([DOMAINS[(i // 100) % len(DOMAINS)] for i in range(start, start + n)])
            prompts = pa.array([f"Prompt number {i}" for i in range(start, start + n)])
            writer.write_table(pa.table([ids, dom, prompts], schema=schema))


def plan_child(path: str, unit_rows: int, domain: str | None) -> None:
    """Runs in a fresh interpreter: plan, then print time, units and peak RSS as JSON."""
    from batchspec.io.planner import plan_units

    started = time.perf_counter()
    units = plan_units([Path(path)], unit_rows, domain)
    seconds = time.perf_counter() - started
    # VmHWM is this process's own peak; ru_maxrss would also count the parent's at fork.
    status = Path("/proc/self/status").read_text()
    peak_mb = int(next(x for x in status.splitlines() if x.startswith("VmHWM")).split()[1]) / 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "units": len(units),
                "peak_rss_mb": peak_mb,
                "rows": sum(u.num_rows for u in units),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--unit-rows", type=int, default=256)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        path, unit_rows, domain = args.child
        plan_child(path, int(unit_rows), None if domain == "-" else domain)
        return
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        path = Path(tmp) / "big.parquet"
        started = time.perf_counter()
        write_input(path, args.rows)
        print(
            f"input: {args.rows:,} rows, {path.stat().st_size / 1e6:.0f} MB Parquet "
            f"(written in {time.perf_counter() - started:.1f} s)"
        )
        for domain in ("domain", "-"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path), str(args.unit_rows), domain],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout)
            assert r["rows"] == args.rows, r
            label = "with domain column" if domain != "-" else "without domain column"
            ok = r["seconds"] < 60 and r["peak_rss_mb"] < 500
            print(
                f"plan {label}: {r['units']:,} units in {r['seconds']:.1f} s, peak RSS "
                f"{r['peak_rss_mb']:.0f} MB (targets < 60 s, < 500 MB: {'ok' if ok else 'MISSED'})"
            )


if __name__ == "__main__":
    main()
