"""Which columns an export keeps: ``--columns``, by profile or by name.

A run writes ~28 columns per row, and a dataset's users want different shares of them: most
train on the generation alone, some study speculation's acceptance, and the run's timings and
unit ids matter to whoever ran it. Three profiles name those shares, each within the next:

- ``generation``: the row's identity (id, domain, the pass-through columns, ``sample_index``),
  the prompt, the generation and what describes it (token counts, finish reason, logprobs
  where asked) and ``error``;
- ``acceptance``: that, and the speculative columns (engine, method, K, drafted and accepted
  tokens, the rates, the histogram, the replay at every K);
- ``all``, the default: every column, the schema docs/output.md promises, whatever the rows
  hold, so that a pipeline reading one export reads the next.

Column names may be listed instead of profiles or beside them (``--columns generation,e2e_s``).
The dataset keeps its own column order whatever the order of the list: one set of columns,
one schema.

A nested column that a profile takes in but that no row filled is left out: ``logprobs`` and
``prompt_logprobs`` where neither the job nor a request asked for them, the histogram and the
replay where nothing was drafted or replayed. Null in every row, such a column tells a reader
a type and nothing else. Which are empty is read from the parts before anything is written
(those columns alone, until each has shown a value), because a shard's schema is fixed at its
first row. ``all`` keeps them, and a column named in the list is kept whatever it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.writer import RESULT_FIELDS
from batchspec.observe.scan import read_part


def span(first: str, last: str) -> list[str]:
    """The output columns from ``first`` to ``last`` in the writer's order (``RESULT_FIELDS``),
    which keeps each kind together: the generation, the speculative counts, the replay,
    logprobs, timings. A column added within a kind joins the profiles that take it."""
    names = [f.name for f in RESULT_FIELDS]
    return names[names.index(first) : names.index(last) + 1]


SPECULATIVE = span("engine", "replayed_accepted")
"""How each row was drafted and what was accepted, and its replay at every K."""
TIMINGS = span("queue_s", "output_tokens_per_s")
GENERATION = [*span("sample_index", "finish_reason"), *span("logprobs", "prompt_logprobs"), "error"]
"""The output columns of ``generation``: besides them it keeps every column that is not an
output column (id, domain, pass-through, the prompt)."""
ACCEPTANCE = [*GENERATION, *SPECULATIVE]
ALL = [f.name for f in RESULT_FIELDS]
PROFILES = {"generation": GENERATION, "acceptance": ACCEPTANCE, "all": ALL}
DEFAULT = "all"
SPARSE = {"logprobs", "prompt_logprobs", "acceptance_histogram", "replayed_k", "replayed_accepted"}
"""Nested columns that whole runs leave null (nothing asked, drafted or replayed)."""


@dataclass(frozen=True)
class Kept:
    """The columns an export writes, and what the card says of the rest."""

    schema: pa.Schema
    asked: str
    """``--columns`` as given."""
    left_out: list[str] = field(default_factory=list)
    """Columns of the run not in the selection."""
    empty: list[str] = field(default_factory=list)
    """Of those, the nested ones a profile took in but no row filled."""


def choose(
    asked: str, schema: pa.Schema, prompt: str | None, empty: Callable[[list[str]], set[str]]
) -> Kept:
    """The columns of ``schema`` that ``asked`` (profiles and names, comma-separated) keeps;
    ``prompt``: the input's prompt column left out by ``--no-prompts``, named if asked for;
    ``empty``: which of some columns no committed row filled (called only for a profile's
    nested columns)."""
    items = [item.strip() for item in asked.split(",")]
    if not all(items):
        raise UserError(f"--columns: {asked!r} has an empty name; e.g. --columns generation")
    outputs = set(ALL)
    named: set[str] = set()
    profiled: set[str] = set()
    for item in items:
        if item in PROFILES:
            profiled |= {n for n in schema.names if n not in outputs or n in PROFILES[item]}
        elif item in schema.names:
            named.add(item)
        elif item == prompt:
            raise UserError(f"--columns: {item!r} is the prompt column, left out by --no-prompts")
        else:
            raise UserError(
                f"--columns: {item!r} is neither a profile ({', '.join(PROFILES)}) nor a column "
                f"of this run ({', '.join(schema.names)})"
            )
    sparse = [n for n in schema.names if n in SPARSE & profiled - named]
    dropped = empty(sparse) if sparse and "all" not in items else set()
    keep = (profiled - dropped) | named
    return Kept(
        pa.schema([f for f in schema if f.name in keep]),
        asked,
        [n for n in schema.names if n not in keep],
        [n for n in schema.names if n in dropped],
    )


def empty_columns(out: OutDir, schema: pa.Schema, names: list[str]) -> set[str]:
    """Which of ``names`` are null in every committed row: each part's columns still unseen
    filled are read alone (a part written before a column existed reads it as null), and
    the pass stops once every one has shown a value."""
    left = set(names)
    for path in out.part_files():
        if not left:
            break
        rows = read_part(path, pa.schema([schema.field(n) for n in sorted(left)]))
        left -= {n for n in rows.column_names if rows.column(n).null_count < rows.num_rows}
    return left


def kept_for(out: OutDir, job: dict[str, Any], schema: pa.Schema, asked: str) -> Kept:
    """``choose`` for a run's export: ``schema`` the rows' (the prompt column in it unless
    ``--no-prompts`` left it out), empty columns read from the run's parts."""
    inp = job["spec"]["input"]
    prompt = inp.get("prompt_column") or inp.get("messages_column")
    left_out = None if prompt in schema.names else prompt
    return choose(asked, schema, left_out, lambda names: empty_columns(out, schema, names))
