"""Benchmark: a large JSONL input staged into Parquet once, then planned and read per unit.

Writes ``--rows`` JSON lines (default 10M; ``{"id", "domain", "prompt"}`` with prompts of
``--prompt-bytes`` incompressible text, 6 interleaved domains), then, each step in a fresh
process (for its own peak RSS), the way a run does it: the staging of the lines into Parquet
shards (``io/convert.py``), planning and the id check over the shards, the reader's row-group
staging of the shards (interleaved domains: every unit would otherwise decode its chunk's six
domains) and per-unit reads (``UnitReader.read``, what ``PromptBuilder.build`` calls) of a
random spread of units. Run it at two sizes to see linear time (``--rows 1000000``). Targets
(issue 37): staging linear with bounded memory; per-unit read p50 <= 20 ms, peak <= 500 MB.
The last line is ``staged N lines in S s (R lines/s), peak RSS M MB; ...``.

    .venv/bin/python scripts/bench_stage.py [--rows 10000000] [--prompt-bytes 256]
        [--unit-rows 256] [--units 300] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAINS = ["chat", "code", "math", "qa", "summarization", "translation"]


def write_lines(path: Path, rows: int, prompt_bytes: int) -> float:
    """The JSONL input, a million lines at a time (polars writes them); seconds taken."""
    import base64

    import numpy as np
    import polars as pl

    started = time.perf_counter()
    with open(path, "wb") as fh:
        for first in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - first)
            text = base64.b64encode(os.urandom(n * prompt_bytes * 3 // 4)).decode()
            prompts = [text[i * prompt_bytes : (i + 1) * prompt_bytes] for i in range(n)]
            ids = np.arange(first, first + n)
            frame = pl.DataFrame(
                {
                    "id": [f"r{i}" for i in ids],
                    "domain": [DOMAINS[i % len(DOMAINS)] for i in ids],
                    "prompt": prompts,
                }
            )
            frame.write_ndjson(fh)
    return time.perf_counter() - started


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss would survive exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def step(args: argparse.Namespace) -> dict:
    """One measured step, in this (fresh) process."""
    from batchspec.io.convert import Staging, staged_files
    from batchspec.io.ids import check_ids
    from batchspec.io.layout import OutDir
    from batchspec.io.planner import plan_units
    from batchspec.io.reader import UnitReader, required_columns
    from batchspec.io.sources import Source
    from batchspec.spec import InputSpec
    from batchspec.spec.sampling import SamplingSpec

    work = Path(args.dir)
    spec = InputSpec(
        path="in.jsonl", format="jsonl", prompt_column="prompt", domain_column="domain"
    )
    how = Staging(spec, SamplingSpec(), args.unit_rows, required_columns(spec))
    out = OutDir(work / "out")
    started = time.perf_counter()
    files, _ = staged_files(out, [Source(work / "in.jsonl", "jsonl")], how)
    result: dict = {"seconds": time.perf_counter() - started, "files": len(files)}
    if args.step == "stage":
        return result | {"peak_mb": peak_rss_mb()}
    started = time.perf_counter()
    units = plan_units(files, args.unit_rows, "domain")
    check_ids(files, "id")
    result["plan_s"] = time.perf_counter() - started
    reader = UnitReader(spec, args.unit_rows, units)
    result["restage_s"] = reader.stage(out, units)
    sample = random.Random(0).sample(units, min(args.units, len(units)))
    times = []
    for unit in sample:
        t = time.perf_counter()
        table = reader.read(unit)
        times.append(time.perf_counter() - t)
        assert table.num_rows == unit.num_rows
    times.sort()
    result |= {"units": len(units), "p50_ms": times[len(times) // 2] * 1e3}
    result |= {"p99_ms": times[int(len(times) * 0.99)] * 1e3, "peak_mb": peak_rss_mb()}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--prompt-bytes", type=int, default=256)
    p.add_argument("--unit-rows", type=int, default=256)
    p.add_argument("--units", type=int, default=300, help="units read for the latencies")
    p.add_argument("--dir", help="working folder (default: a temporary one, removed after)")
    p.add_argument("--step", choices=["stage", "read"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        print(json.dumps(step(args)))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_stage-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        wrote = write_lines(work / "in.jsonl", args.rows, args.prompt_bytes)
        size = (work / "in.jsonl").stat().st_size / 1e9
        print(f"input: {args.rows} lines, {size:.2f} GB, written in {wrote:.1f} s", flush=True)
        results = {}
        for name in ("stage", "read"):
            cmd = [sys.executable, __file__, "--step", name, "--dir", str(work)]
            cmd += ["--unit-rows", str(args.unit_rows), "--units", str(args.units)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name}: {results[name]}", flush=True)
        st, rd = results["stage"], results["read"]
        print(
            f"staged {args.rows} lines in {st['seconds']:.1f} s "
            f"({args.rows / st['seconds']:,.0f} lines/s), peak RSS {st['peak_mb']:.0f} MB; "
            f"plan + id check {rd['plan_s']:.1f} s; row-group staging {rd['restage_s']:.1f} s; "
            f"per-unit read p50 {rd['p50_ms']:.1f} ms, p99 {rd['p99_ms']:.1f} ms, "
            f"peak RSS {rd['peak_mb']:.0f} MB"
        )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
