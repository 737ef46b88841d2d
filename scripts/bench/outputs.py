"""``batchspec report``, ``status`` and ``export`` on a large finished output (``synthetic.py``:
an input and the parts a run leaves for it, in the real schema), each command in a fresh
process for its peak RSS and time. ``report``: report and status (target under 1 GB);
``export``: ``report --plots``, then export with and without prompts, ids and prompts checked
against the input row for row (target under 1 GB).

    .venv/bin/python scripts/bench/outputs.py report [--rows 10000000] [--unit-rows 256]
    .venv/bin/python scripts/bench/outputs.py export [--rows 10000000] [--domains] [--dir D]
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from harness import cli_here, fresh, header, workdir
from synthetic import BLOCK, write_input, write_parts


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


def prepare(work: Path, args: argparse.Namespace) -> Path:
    """The input and the run's output in ``work``; reused when a kept ``--dir`` has them."""
    inp, out = work / "in.parquet", work / "out"
    if (out / "parts").is_dir():
        print(f"output: reusing {out} ({pq.read_metadata(inp).num_rows:,} rows)")
        return out
    started = time.perf_counter()
    prompt_bytes = args.prompt_bytes or (1024 if args.what == "export" else 16)
    write_input(inp, args.rows, prompt_bytes, args.group_rows)
    n = write_parts(out, inp, args.unit_rows, args.domains, args.text_bytes)
    size = sum(p.stat().st_size for p in (out / "parts").iterdir()) / 1e9
    print(f"output: {args.rows:,} rows in {n:,} parts ({size:.2f} GB; domains interleaved: "
          f"{args.domains}; generated_text {args.text_bytes} B per row); input "
          f"{inp.stat().st_size / 1e9:.2f} GB, prompts {prompt_bytes} B, row groups of "
          f"{args.group_rows:,} rows; in {time.perf_counter() - started:.0f} s")  # fmt: skip
    return out


def command(*argv: str) -> dict:
    """One CLI command in a fresh process, its RSS and time printed; what it measured."""
    r = fresh(cli_here, *argv)
    print(f"--- batchspec {' '.join(argv[:1] + argv[2:])}: peak RSS {r['peak_mb']:.0f} MB, "
          f"{r['seconds']:.1f} s")  # fmt: skip
    return r


def export(work: Path, out: Path, args: argparse.Namespace) -> None:
    inp = work / "in.parquet"
    if not args.no_report:
        command("report", str(out), "--plots", str(work / "plots"))
    for flags in args.export_flags or ["", "--no-prompts"]:
        dest = work / "dataset"
        shutil.rmtree(dest, ignore_errors=True)
        r = command("export", str(out), "--to", str(dest), "--shard-mb", args.shard_mb,
                    *shlex.split(flags))  # fmt: skip
        print(r["text"].rstrip())
        names = pq.read_schema(next((dest / "data").iterdir())).names
        ids = same_column(dest, inp, "id")
        prompts = same_column(dest, inp, "prompt") if "prompt" in names else None
        ok = "ok" if r["peak_mb"] < 1024 and ids and prompts is not False else "MISSED"
        print(f"export: ids equal the input's, in order: {ids}; prompts: "
              f"{'not exported' if prompts is None else prompts}; RSS < 1 GB: {ok}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["report", "export"])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--unit-rows", type=int, default=256, help="rows per part (unit)")
    ap.add_argument("--text-bytes", type=int, default=256, help="generated_text per row")
    ap.add_argument("--prompt-bytes", type=int, help="default 1024 for export, 16 for report")
    ap.add_argument("--group-rows", type=int, default=262_144, help="input rows per row group")
    ap.add_argument("--domains", action="store_true", help="a domain column, interleaved")
    ap.add_argument("--shard-mb", default="500")
    ap.add_argument("--no-report", action="store_true", help="export: skip report --plots")
    ap.add_argument("--export-flags", action="append", help="one export each ('', --no-prompts)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()
    header()
    with workdir(args.dir, f"bench_{args.what}-") as work:
        out = prepare(work, args)
        if args.what == "export":
            export(work, out, args)
            return
        for name in ("report", "status"):
            print(command(name, str(out))["text"].rstrip())
        r = fresh(cli_here, "report", str(out))
        print(f"report on {args.rows:,} rows: peak RSS {r['peak_mb']:.0f} MB, {r['seconds']:.1f} "
              f"s (target < 1 GB: {'ok' if r['peak_mb'] < 1024 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()
