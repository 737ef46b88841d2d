"""Benchmark: `batchspec export` and `batchspec report --plots` on a large output, peak RSS.

Writes an input (ids, a domain column — with ``--domains`` domains interleaved row by row and
read by the job — and prompts of ``--prompt-bytes`` random characters in row groups of
``--group-rows`` rows) and the committed parts a run would leave for it, in the real output
schema (``bench_report``'s synthetic rows: ``generated_text`` of ``--text-bytes`` random
characters), with the run's manifest and job record; then runs ``batchspec report --plots``
and ``batchspec export`` (once per ``--export-flags`` entry: by default with the prompts and
with ``--no-prompts``) through the CLI, each in a fresh process, and checks the exported ids,
and prompts where exported, against the input, row for row. Target: export under 1 GB RSS.

    .venv/bin/python scripts/bench_export.py [--rows 10000000] [--unit-rows 256] [--domains]
        [--prompt-bytes 1024] [--group-rows 262144] [--dir D (kept; its data reused)]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
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

BLOCK = 65_536


def random_texts(n: int, size: int) -> pa.Array:
    """``n`` strings of ``size`` random base64 characters (barely compressible)."""
    data = base64.b64encode(os.urandom(n * size * 3 // 4 + 3))[: n * size]
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int64) * size).astype(np.int32).tobytes())
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(data))


def write_input(path: Path, rows: int, prompt_bytes: int, group_rows: int) -> None:
    """The input, one row group of ``group_rows`` rows per write (the writer's memory)."""
    schema = pa.schema([("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, group_rows):
            n = min(group_rows, rows - start)
            ids = pa.array([f"r{i}" for i in range(start, start + n)])
            dom = pa.array([DOMAINS[i % len(DOMAINS)] for i in range(start, start + n)])
            w.write_table(
                pa.table([ids, dom, random_texts(n, prompt_bytes)], schema=schema),
                row_group_size=n,
            )


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
        "input": {
            "id_column": "id",
            "prompt_column": "prompt",
            "messages_column": None,
            "domain_column": "domain" if domains else None,
            "passthrough_columns": [],
        },
        "output": {"unit_rows": unit_rows},
        "model": {"model": "bench", "dtype": "float32", "max_num_seqs": 16},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 0.0, "max_tokens": 128},
    }
    job = {"spec": spec, "base_dir": str(inp.parent), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(job))
    return len(units)


def fixed(batches: Iterator[pa.RecordBatch], column: str, size: int) -> Iterator[pa.Array]:
    """One column of a stream of batches, re-cut into arrays of ``size`` rows (the last less)."""
    pending: list[pa.Array] = []
    held = 0
    for batch in batches:
        pending.append(batch.column(column))
        held += batch.num_rows
        while held >= size:
            whole = pa.concat_arrays(pending)
            yield whole.slice(0, size)
            pending, held = [whole.slice(size)], held - size
    if held:
        yield pa.concat_arrays(pending)


def same_column(dest: Path, inp: Path, column: str) -> bool:
    """The exported column equals the input's, row for row, compared in bounded memory."""
    got = pads.dataset(dest / "data", format="parquet").to_batches(columns=[column])
    want = pq.ParquetFile(inp).iter_batches(batch_size=BLOCK, columns=[column])
    a, b = fixed(got, column, BLOCK), fixed(want, column, BLOCK)
    return all(x.equals(y) for x, y in zip(a, b, strict=True))


def prepare(work: Path, args: argparse.Namespace) -> OutDir:
    """The input and the run's output in ``work``; reused when a kept ``--dir`` has them."""
    inp, out = work / "in.parquet", OutDir(work / "out")
    if out.manifest.exists():
        print(f"output: reusing {out} ({pq.read_metadata(inp).num_rows:,} rows)")
        return out
    started = time.perf_counter()
    write_input(inp, args.rows, args.prompt_bytes, args.group_rows)
    n = write_parts(out, inp, args.rows, args.unit_rows, args.domains, args.text_bytes)
    size = sum(p.stat().st_size for p in out.part_files()) / 1e9
    print(
        f"output: {args.rows:,} rows in {n:,} parts ({size:.2f} GB; domains interleaved: "
        f"{args.domains}); input {inp.stat().st_size / 1e9:.2f} GB, prompts "
        f"{args.prompt_bytes} B, row groups of {args.group_rows:,} rows; written in "
        f"{time.perf_counter() - started:.0f} s"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--unit-rows", type=int, default=256)
    ap.add_argument("--text-bytes", type=int, default=256)
    ap.add_argument("--prompt-bytes", type=int, default=1024)
    ap.add_argument("--group-rows", type=int, default=262_144, help="input rows per row group")
    ap.add_argument("--domains", action="store_true", help="a domain column, interleaved")
    ap.add_argument("--shard-mb", default="500")
    ap.add_argument("--no-report", action="store_true", help="skip report --plots")
    ap.add_argument(
        "--export-flags",
        action="append",
        help="extra export flags, one run each (default: '' and '--no-prompts')",
    )
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_export-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        out = prepare(work, args)
        inp = work / "in.parquet"
        if not args.no_report:
            rss, secs, _ = measure(["report", str(out.root), "--plots", str(work / "plots")])
            print(f"--- batchspec report --plots: peak RSS {rss:.0f} MB, {secs:.1f} s")
        for flags in args.export_flags or ["", "--no-prompts"]:
            dest = work / "dataset"
            shutil.rmtree(dest, ignore_errors=True)
            cmd = ["export", str(out.root), "--to", str(dest), "--shard-mb", args.shard_mb]
            rss, secs, text = measure(cmd + shlex.split(flags))
            print(f"--- batchspec export {flags}: peak RSS {rss:.0f} MB, {secs:.1f} s")
            print(text.rstrip())
            names = pq.read_schema(next((dest / "data").iterdir())).names
            ids = same_column(dest, inp, "id")
            prompts = same_column(dest, inp, "prompt") if "prompt" in names else None
            ok = "ok" if rss < 1024 and ids and prompts is not False else "MISSED"
            print(
                f"export: ids equal the input's, in order: {ids}; prompts: "
                f"{'not exported' if prompts is None else prompts}; RSS < 1 GB: {ok}"
            )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
