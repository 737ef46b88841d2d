"""Planning a large input: time and peak memory of turning 10,000,000 rows into work units,
with and without a domain column (domains in runs of 100 rows, as a concatenation of sources
mixes them), each in a fresh process. Targets: under 60 s and under 500 MB peak RSS.

    .venv/bin/python scripts/bench/plan.py                 # 10M rows, unit_rows 256
    .venv/bin/python scripts/bench/plan.py --rows 1000000 --unit-rows 1024
"""

from __future__ import annotations

import time
from pathlib import Path

from harness import fresh, header, parser, workdir
from synthetic import write_input


def plan(path: str, unit_rows: int, domain: str | None) -> dict:
    """The planner alone, in a fresh process: seconds, units and rows planned."""
    from batchspec.io.planner import plan_units

    started = time.perf_counter()
    units = plan_units([Path(path)], unit_rows, domain)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "units": len(units), "rows": sum(u.num_rows for u in units)}


def main() -> None:
    args = parser(__doc__, rows=10_000_000, unit_rows=256).parse_args()
    header()
    with workdir(None, "bench-plan-") as tmp:
        path, started = tmp / "big.parquet", time.perf_counter()
        write_input(path, args.rows, 16, 1_000_000, run=100)
        print(f"input: {args.rows:,} rows, {path.stat().st_size / 1e6:.0f} MB Parquet "
              f"(written in {time.perf_counter() - started:.1f} s)")  # fmt: skip
        for domain in ("domain", None):
            r = fresh(plan, str(path), args.unit_rows, domain)
            assert r["rows"] == args.rows, r
            ok = r["seconds"] < 60 and r["peak_mb"] < 500
            print(f"plan {'with' if domain else 'without'} domain column: {r['units']:,} units in "
                  f"{r['seconds']:.1f} s, peak RSS {r['peak_mb']:.0f} MB (targets < 60 s, "
                  f"< 500 MB: {'ok' if ok else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()
