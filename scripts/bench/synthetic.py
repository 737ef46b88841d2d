"""Synthetic inputs and outputs at scale for the benchmarks of planning, reading, staging,
report and export: a Parquet or JSON lines input of ids, interleaved domains and incompressible
prompts, and the committed parts a run would leave for it in the product's own output schema
(``output_schema``), with its manifest and job record, so that the CLI takes it as a finished
run. Written in blocks, so that 10M rows fit in a few hundred MB."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DOMAINS = ["chat", "code", "math", "qa", "summarization", "translation"]
BLOCK = 65_536


def random_texts(n: int, size: int) -> pa.Array:
    """``n`` strings of ``size`` random base64 characters (barely compressible)."""
    data = base64.b64encode(os.urandom(n * size * 3 // 4 + 3))[: n * size]
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int64) * size).astype(np.int32).tobytes())
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(data))


def domains(start: int, n: int, run: int = 1) -> pa.Array:
    """The domain of rows ``start..start+n``: runs of ``run`` rows per domain, in turn."""
    codes = pa.array((np.arange(start, start + n) // run % len(DOMAINS)).astype(np.int32))
    return pa.DictionaryArray.from_arrays(codes, pa.array(DOMAINS)).cast(pa.string())


def write_input(path: Path, rows: int, prompt_bytes: int, group_rows: int | None = None,
                run: int = 1) -> None:  # fmt: skip
    """The input, ``group_rows`` rows per row group and per write (None: one row group of up
    to pyarrow's 1M rows, all written at once)."""
    schema = pa.schema([("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string())])
    step = group_rows or rows
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, step):
            n = min(step, rows - start)
            ids = pa.array([f"r{i}" for i in range(start, start + n)])
            table = pa.table([ids, domains(start, n, run), random_texts(n, prompt_bytes)],
                             schema=schema)  # fmt: skip
            w.write_table(table, row_group_size=group_rows)


def write_lines(path: Path, rows: int, prompt_bytes: int) -> None:
    """The same rows as JSON lines (``{"id", "domain", "prompt"}``), a million at a time."""
    import polars as pl

    with open(path, "wb") as fh:
        for first in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - first)
            ids = pa.array([f"r{i}" for i in range(first, first + n)])
            table = pa.table({"id": ids, "domain": domains(first, n),
                              "prompt": random_texts(n, prompt_bytes)})  # fmt: skip
            pl.from_arrow(table).write_ndjson(fh)


def output_block(start: int, n: int, text_bytes: int) -> pa.Table:
    """``n`` synthetic output rows from row ``start``: every column a real part has, K=3 with
    acceptance histograms filled, ``generated_text`` of ``text_bytes`` random characters."""
    from batchspec.io.writer import output_schema

    rng, k = np.random.default_rng(start), 3
    hist = rng.integers(0, 20, size=(n, k + 1), dtype=np.int32)
    steps = hist.sum(axis=1, dtype=np.int32)
    accepted = (hist * np.arange(k + 1, dtype=np.int32)).sum(axis=1, dtype=np.int32)
    drafted, out_tok, e2e = steps * k, accepted + steps, rng.uniform(1, 20, n)
    cols = {
        "id": pa.array([f"r{i}" for i in range(start, start + n)]),
        "domain": domains(start, n),
        "generated_text": random_texts(n, text_bytes),
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
    }
    schema = output_schema(pa.string(), {})
    return pa.table([cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
                     for f in schema], schema=schema)  # fmt: skip


def write_parts(root: Path, inp: Path, unit_rows: int, by_domain: bool, text_bytes: int) -> int:
    """Every planned unit's part (the block's rows of the unit's domain, in input order), the
    manifest and the job record, as a finished run leaves them; returns the units."""
    from batchspec.io.layout import OutDir
    from batchspec.io.manifest import Manifest, input_fingerprint
    from batchspec.io.planner import plan_units

    out, rows = OutDir(root), pq.read_metadata(inp).num_rows
    units = plan_units([inp], unit_rows, "domain" if by_domain else None)
    out.parts.mkdir(parents=True)
    table, first = None, -1
    for u in units:
        if table is None or u.stop > first + table.num_rows:
            first = u.start - u.start % BLOCK
            table = output_block(first, min(BLOCK, rows - first), text_bytes)
        piece = table.slice(u.start - first, u.stop - u.start)
        if u.domain is not None:
            piece = piece.filter(pa.array(np.arange(u.start, u.stop) % len(DOMAINS)
                                          == DOMAINS.index(u.domain)))  # fmt: skip
        at = piece.schema.get_field_index("unit_id")
        piece = piece.set_column(at, "unit_id", pa.array([u.unit_id] * len(piece)))
        pq.write_table(piece, out.part(u.unit_id), compression="zstd")
    manifest = Manifest("bench", input_fingerprint([inp]), None, len(units), rows, time.time(), "0")
    out.manifest.write_text(json.dumps(manifest.__dict__))
    spec = {
        "name": "bench",
        "input": {"id_column": "id", "prompt_column": "prompt", "messages_column": None,
                  "domain_column": "domain" if by_domain else None, "passthrough_columns": []},
        "output": {"unit_rows": unit_rows},
        "model": {"model": "bench", "dtype": "float32", "max_num_seqs": 16},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 0.0, "max_tokens": 128},
    }  # fmt: skip
    job = {"spec": spec, "base_dir": str(inp.parent), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(job))
    return len(units)
