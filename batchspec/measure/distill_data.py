"""``batchspec distill``'s data: the committed rows of a job's output directory, as token ids,
and the target's features over each row, computed once and kept on disk.

A row is its prompt (rebuilt from the input as the run built it: same template, same
tokenizer) followed by its generated text (tokenized again: the parts keep text, not ids).
The features of a position are the target's residual stream entering the head's feature
layers, and the last layer's output (from which the teacher's logits are recomputed: 49k
logits per token are never stored). They are written in chunks of rows
(``features/chunk_NNNNN.safetensors``, bfloat16) so that memory stays bounded by one chunk
and an interrupted distill reuses what it finished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from batchspec.engines.tree.eagle_head import TappedModel
from batchspec.errors import UserError
from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.io.layout import OutDir
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec

CHUNK_ROWS = 16
"""Rows per features file: ~16 x 200 positions x 4 x 576 bfloat16 = 15 MB on the default job."""
MAX_SEQ = 1024
"""Positions of a row kept for training (a longer row is cut): bounds one row's activations."""


@dataclass
class Row:
    """One committed row: its id, domain, prompt and output token ids."""

    row_id: Any
    domain: str | None
    prompt: list[int]
    output: list[int]

    @property
    def tokens(self) -> list[int]:
        return (self.prompt + self.output)[:MAX_SEQ]

    @property
    def held_out_key(self) -> float:
        """A number in [0, 1) fixed by the row's id: rows below the hold-out fraction are
        held out, the same rows on every distill of the job."""
        digest = hashlib.sha1(repr(self.row_id).encode()).hexdigest()
        return int(digest[:8], 16) / 2**32


def committed_rows(spec: JobSpec, out: OutDir, limit: int | None) -> tuple[list[Row], Any]:
    """The job's committed rows without an error (at most ``limit``, spread over the parts in
    their order), and the target's tokenizer."""
    parts = out.part_files()
    if not parts:
        raise UserError(f"{out}: no committed units yet (run the job first; distill reads them)")
    pre = preflight(spec)
    tokenizer = load_tokenizer(pre.tokenizer_dir, "model.tokenizer")
    units = {u.unit_id: u for u in pre.units}
    builder = PromptBuilder(spec.input, tokenizer, 1 << 30, spec.sampling.seed, pre.reader)
    rows: list[Row] = []
    for part in parts:
        table = pq.read_table(part, columns=["id", "domain", "generated_text", "error", "unit_id"])
        data = table.to_pylist()
        unit = units.get(data[0]["unit_id"]) if data else None
        if unit is None:
            continue
        prompts = {r.row_id: r.prompt_token_ids for r in builder.build(unit).rows}
        for r in data:
            prompt = prompts.get(r["id"])
            if r["error"] or not prompt or not r["generated_text"]:
                continue
            output = tokenizer(r["generated_text"], add_special_tokens=False)["input_ids"]
            rows.append(Row(r["id"], r["domain"], list(prompt), list(output)))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"{out}: no committed rows with output to distill from")
    return rows[:limit] if limit is not None else rows, tokenizer


class FeatureStore:
    """Features of a list of rows in chunk files under ``root``, computed when missing."""

    def __init__(self, root: Path, rows: list[Row], taps: list[int]) -> None:
        self.root, self.rows, self.taps = root, rows, taps
        root.mkdir(parents=True, exist_ok=True)
        key = json.dumps([taps, [[r.row_id, len(r.tokens)] for r in rows]], default=str)
        self.key = hashlib.sha1(key.encode()).hexdigest()[:16]
        """The whole store's (a training checkpoint belongs to it)."""

    def chunks(self) -> list[list[int]]:
        """Row indices of each chunk."""
        n = len(self.rows)
        return [list(range(i, min(i + CHUNK_ROWS, n))) for i in range(0, n, CHUNK_ROWS)]

    def path(self, chunk: int) -> Path:
        """Named by its own rows, so a distill of fewer rows (or more) reuses every chunk
        that holds the same rows."""
        rows = [[self.rows[i].row_id, len(self.rows[i].tokens)] for i in self.chunks()[chunk]]
        key = hashlib.sha1(json.dumps([self.taps, rows], default=str).encode()).hexdigest()
        return self.root / f"chunk_{key[:16]}.safetensors"

    def missing(self) -> list[int]:
        return [c for c in range(len(self.chunks())) if not self.path(c).exists()]

    def compute(self, model: TappedModel, chunk: int) -> None:
        """Run the target over the chunk's rows (one slot, whole rows) and write the file."""
        tensors = {}
        for i in self.chunks()[chunk]:
            tokens = self.rows[i].tokens
            model.prefill(0, tokens)
            feats = model.take(0)
            model.release(0)
            assert feats is not None
            tensors[f"f{i}"] = feats.to(torch.bfloat16).contiguous()
            tensors[f"t{i}"] = torch.tensor(tokens, dtype=torch.long)
        tmp = self.path(chunk).with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.rename(self.path(chunk))

    def read(self, chunk: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(row index, tokens [T], features [T, F] float32) of every row of a chunk."""
        tensors = load_file(str(self.path(chunk)))
        for i in self.chunks()[chunk]:
            yield i, tensors[f"t{i}"], tensors[f"f{i}"].float()
