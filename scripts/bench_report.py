"""Benchmark: `batchspec report` and `status` on a 10M-row output, peak RSS and time.

Writes synthetic committed parts with the product's own output schema (``output_schema``:
every column a real part has, ``generated_text`` of ``--text-bytes`` random characters,
6 domains, speculative columns and histograms filled) into a fresh output directory, then runs
``batchspec report`` and ``batchspec status`` through the CLI, each in a fresh process, and
prints each one's peak RSS and wall time. Target: report under 1 GB.

Parts hold ``--part-rows`` rows (default 256, as a run with the default ``unit_rows`` writes:
39,063 parts for 10M rows; writing them takes about two minutes on a 2-core machine).

    .venv/bin/python scripts/bench_report.py [--rows 10000000] [--part-rows 256] [--dir D]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAINS = ["chat", "code", "math", "qa", "summarization", "translation"]
BLOCK = 65536

MEASURE = """
import sys, time
from batchspec.cli import main
started = time.perf_counter()
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
    print(f"@@ {int(hwm) / 1024:.0f} {time.perf_counter() - started:.2f}", file=sys.stderr)
"""


def block(start: int, n: int, text_bytes: int):
    """``n`` synthetic output rows starting at row ``start``, in the output schema."""
    import numpy as np
    import pyarrow as pa

    from batchspec.io.writer import output_schema

    rng = np.random.default_rng(start)
    k = 3
    hist = rng.integers(0, 20, size=(n, k + 1), dtype=np.int32)
    steps = hist.sum(axis=1, dtype=np.int32)
    accepted = (hist * np.arange(k + 1, dtype=np.int32)).sum(axis=1, dtype=np.int32)
    drafted = steps * k
    out_tok = accepted + steps
    text = base64.b64encode(os.urandom(n * text_bytes * 3 // 4))
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * text_bytes).tobytes())
    e2e = rng.uniform(1, 20, n)
    cols = {
        "id": pa.array([f"r{i}" for i in range(start, start + n)]),
        "domain": pa.array([DOMAINS[i % len(DOMAINS)] for i in range(start, start + n)]),
        "generated_text": pa.StringArray.from_buffers(n, offsets, pa.py_buffer(text)),
        "num_prompt_tokens": pa.array(rng.integers(10, 500, n, dtype=np.int32)),
        "num_output_tokens": pa.array(out_tok),
        "finish_reason": pa.array(["stop"] * n),
        "engine": pa.array(["vllm"] * n),
        "spec_method": pa.array(["ngram"] * n),
        "num_speculative_tokens": pa.array(np.full(n, k, dtype=np.int32)),
        "num_spec_steps": pa.array(steps),
        "num_draft_tokens": pa.array(drafted),
        "num_accepted_tokens": pa.array(accepted),
        "acceptance_rate": pa.array(accepted / np.maximum(drafted, 1)),
        "mean_acceptance_length": pa.array(1 + accepted / np.maximum(steps, 1)),
        "acceptance_histogram": pa.ListArray.from_arrays(
            pa.array(np.arange(n + 1, dtype=np.int32) * (k + 1)), pa.array(hist.ravel())
        ),
        "queue_s": pa.array(np.zeros(n)),
        "ttft_s": pa.array(np.full(n, 0.1)),
        "decode_s": pa.array(e2e - 0.1),
        "e2e_s": pa.array(e2e),
        "output_tokens_per_s": pa.array(out_tok / e2e),
        "sample_index": pa.array(np.zeros(n, dtype=np.int32)),
        "logprobs": pa.nulls(n),
        "prompt_logprobs": pa.nulls(n),
        "error": pa.nulls(n, pa.string()),
        "unit_id": pa.nulls(n, pa.string()),
    }
    schema = output_schema(pa.string(), {})
    return pa.table([cols[f.name].cast(f.type) for f in schema], schema=schema)


def write_output(out: Path, rows: int, part_rows: int, text_bytes: int) -> int:
    """Parts of ``part_rows`` rows, named like real units, plus a manifest; returns parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchspec.io.layout import OutDir
    from batchspec.io.manifest import Manifest

    od = OutDir(out)
    od.parts.mkdir(parents=True)
    parts = 0
    for start in range(0, rows, BLOCK):
        table = block(start, min(BLOCK, rows - start), text_bytes)
        for off in range(0, table.num_rows, part_rows):
            first = start + off
            unit_id = f"f0000-r{first:010d}-{min(first + part_rows, rows):010d}"
            piece = table.slice(off, part_rows)
            piece = piece.set_column(
                piece.schema.get_field_index("unit_id"),
                "unit_id",
                pa.array([unit_id] * piece.num_rows),
            )
            pq.write_table(piece, od.part(unit_id), compression="zstd")
            parts += 1
    manifest = Manifest("bench", "bench", None, parts, rows, time.time(), "bench")
    od.manifest.write_text(json.dumps(manifest.__dict__))
    return parts


def measure(args: list[str]) -> tuple[float, float, str]:
    """Run a CLI command in a fresh process: (peak RSS MB, seconds, its output)."""
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *args], capture_output=True, text=True, check=False
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("@@ "))
    rss, secs = line.split()[1:]
    if proc.returncode:
        sys.exit(f"{args}: exit {proc.returncode}\n{proc.stderr}")
    return float(rss), float(secs), proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--part-rows", type=int, default=256)
    ap.add_argument("--text-bytes", type=int, default=256, help="generated_text per row")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--write", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        print(write_output(Path(args.write[0]), args.rows, args.part_rows, args.text_bytes))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_report-", dir="/tmp"))
    out = work / "out"
    try:
        started = time.perf_counter()
        cmd = [sys.executable, __file__, "--write", str(out), "--rows", str(args.rows)]
        cmd += ["--part-rows", str(args.part_rows), "--text-bytes", str(args.text_bytes)]
        parts = int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        size = sum(p.stat().st_size for p in (out / "parts").iterdir()) / 1e9
        print(
            f"output: {args.rows:,} rows in {parts:,} parts of {args.part_rows} rows, "
            f"{size:.2f} GB (generated_text {args.text_bytes} B per row; written in "
            f"{time.perf_counter() - started:.0f} s)"
        )
        for command in ("report", "status"):
            rss, secs, text = measure([command, str(out)])
            print(f"--- batchspec {command}: peak RSS {rss:.0f} MB, {secs:.1f} s")
            print(text.rstrip())
        rss, secs, _ = measure(["report", str(out)])
        ok = "ok" if rss < 1024 else "MISSED"
        print(
            f"report on {args.rows:,} rows: peak RSS {rss:.0f} MB, {secs:.1f} s "
            f"(target < 1 GB: {ok})"
        )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
