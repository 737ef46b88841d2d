"""Benchmark: `batchspec export` and `batchspec report --plots` on a large output, peak RSS.

Writes an input (ids, and with ``--domains`` a domain column, domains interleaved row by row)
and the committed parts a run would leave for it, in the real output schema (``bench_report``'s
synthetic rows: ``generated_text`` of ``--text-bytes`` random characters), with the run's
manifest and job record; then runs ``batchspec report --plots`` and ``batchspec export`` through
the CLI, each in a fresh process, and checks the exported ids against the input. Target:
export under 1 GB RSS.

    .venv/bin/python scripts/bench_export.py [--rows 10000000] [--unit-rows 256] [--domains]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import DOMAINS, block, measure

from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, input_fingerprint
from batchspec.io.planner import plan_units

BLOCK = 262_144


def write_input(path: Path, rows: int, domains: bool) -> None:
    schema = pa.schema([("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, BLOCK):
            n = min(BLOCK, rows - start)
            ids = pa.array([f"r{i}" for i in range(start, start + n)])
            dom = pa.array([DOMAINS[i % len(DOMAINS)] for i in range(start, start + n)])
            w.write_table(pa.table([ids, dom, pa.array(["p"] * n)], schema=schema))


def write_parts(out: OutDir, inp: Path, rows: int, unit_rows: int, domains: bool, tb: int) -> int:
    """Every planned unit's part: the block's rows of the unit's domain, in input order."""
    units = plan_units([inp], unit_rows, "domain" if domains else None)
    out.parts.mkdir(parents=True)
    table, first = None, -1
    for u in units:
        if table is None or u.stop > first + table.num_rows:
            first = u.start - u.start % BLOCK
            table = block(first, min(BLOCK, rows - first), tb)
        piece = table.slice(u.start - first, u.stop - u.start)
        if u.domain is not None:
            mask = (np.arange(u.start, u.stop) % len(DOMAINS)) == DOMAINS.index(u.domain)
            piece = piece.filter(pa.array(mask))
        piece = piece.set_column(
            piece.schema.get_field_index("unit_id"), "unit_id", pa.array([u.unit_id] * len(piece))
        )
        pq.write_table(piece, out.part(u.unit_id), compression="zstd")
    manifest = Manifest("bench", input_fingerprint([inp]), None, len(units), rows, time.time(), "0")
    out.manifest.write_text(json.dumps(manifest.__dict__))
    spec = {
        "name": "bench",
        "input": {"id_column": "id", "domain_column": "domain" if domains else None},
        "output": {"unit_rows": unit_rows},
        "model": {"model": "bench", "dtype": "float32", "max_num_seqs": 16},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 0.0, "max_tokens": 128},
    }
    job = {"spec": spec, "base_dir": str(inp.parent), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(job))
    return len(units)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--unit-rows", type=int, default=256)
    ap.add_argument("--text-bytes", type=int, default=256)
    ap.add_argument("--domains", action="store_true", help="a domain column, interleaved")
    ap.add_argument("--shard-mb", default="500")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_export-", dir="/tmp"))
    try:
        started = time.perf_counter()
        inp = work / "in.parquet"
        write_input(inp, args.rows, args.domains)
        out = OutDir(work / "out")
        n = write_parts(out, inp, args.rows, args.unit_rows, args.domains, args.text_bytes)
        size = sum(p.stat().st_size for p in out.part_files()) / 1e9
        print(
            f"output: {args.rows:,} rows in {n:,} parts ({size:.2f} GB; domains interleaved: "
            f"{args.domains}; written in {time.perf_counter() - started:.0f} s)"
        )
        rss, secs, _ = measure(["report", str(out), "--plots", str(work / "plots")])
        print(f"--- batchspec report --plots: peak RSS {rss:.0f} MB, {secs:.1f} s")
        dest = work / "dataset"
        rss, secs, text = measure(
            ["export", str(out), "--to", str(dest), "--shard-mb", args.shard_mb]
        )
        print(f"--- batchspec export: peak RSS {rss:.0f} MB, {secs:.1f} s\n{text.rstrip()}")
        ids = pads.dataset(dest / "data", format="parquet").to_table(columns=["id"]).column("id")
        same = ids.equals(pq.read_table(inp, columns=["id"]).column("id"))
        ok = "ok" if rss < 1024 and same else "MISSED"
        print(f"export: ids equal the input's, in order: {same}; RSS < 1 GB: {ok}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
