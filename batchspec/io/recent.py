"""The newest committed outputs of a set of units, read within a token budget.

Suffix drafts (``method: suffix`` on the tree engine) draft from a domain's earlier outputs. A
resumed run, a second worker or a Slurm array task starts with an empty index, though the
output directory may hold thousands of the domain's rows, so a worker reads the newest of them
back (``work/seeding.py``). A job of ten million rows must not cost a read of its output: a
token budget bounds what is read, only two columns of the parts are needed, and the output
is listed once per engine, not once per domain.

Parts carry text, not token ids (docs/output.md): the caller tokenizes what it gets.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from batchspec.io.layout import PART_SUFFIX, OutDir

COLUMNS = ["generated_text", "num_output_tokens"]
"""All that is read of a part (Parquet reads only these columns' chunks)."""


@dataclass
class RecentOutputs:
    """Outputs read back, oldest first (the order an index learns them in: the newest then
    count as its most recent), and what reading them cost."""

    texts: list[str] = field(default_factory=list)
    tokens: int = 0
    """Their ``num_output_tokens``, summed: what the engine generated, before retokenizing."""
    parts_read: int = 0
    parts_seen: int = 0
    """Committed parts of the units asked about (each stat'ed once to order them by age)."""


def parts_by_unit(out: OutDir) -> dict[str, Path]:
    """Every committed part of ``out`` by its unit id: one listing of the output."""
    return {path.name[: -len(PART_SUFFIX)]: path for path in out.part_files()}


def _newest_first(parts: Collection[Path]) -> list[Path]:
    """These parts, the most recently committed first (ties by name)."""
    dated = []
    for path in parts:
        try:
            dated.append((path.stat().st_mtime_ns, path.name, path))
        except FileNotFoundError:
            continue  # replaced under us (--retry-errors): its new version is read next time
    dated.sort(reverse=True)
    return [path for _, _, path in dated]


def recent_outputs(parts: Collection[Path], max_tokens: int) -> RecentOutputs:
    """The newest rows with an output among ``parts`` (committed parts) whose tokens, one
    position more each (the index's separator), fit ``max_tokens``: parts newest first, rows
    of a part from its last; reading stops at the first row that does not fit, so at most one
    part is read beyond what is kept."""
    import pyarrow.parquet as pq

    found = RecentOutputs()
    paths = _newest_first(parts)
    found.parts_seen = len(paths)
    budget = max_tokens
    newest_first: list[str] = []
    for path in paths:
        try:
            table = pq.read_table(path, columns=COLUMNS)
        except FileNotFoundError:
            continue
        found.parts_read += 1
        texts, counts = (table.column(c).to_pylist() for c in COLUMNS)
        for text, n in zip(reversed(texts), reversed(counts), strict=True):
            if not text or not n:
                continue  # an error row, or an empty output: nothing to draft from
            if n + 1 > budget:
                found.texts = newest_first[::-1]
                return found
            newest_first.append(text)
            found.tokens += n
            budget -= n + 1
    found.texts = newest_first[::-1]
    return found
