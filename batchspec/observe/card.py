"""The dataset card (``README.md``) of an exported dataset: the YAML header ``datasets`` and
the Hub read (its ``configs`` name the data files), then what made the rows: job, model,
speculative settings, sampling, the per-domain report table, every column in a sentence with
its type, and why some rows have no acceptance figures.

Every column the writer can produce has its sentence in ``COLUMN_DOCS`` (a test holds every
output column to it): a dataset's user reads the card, not batchspec's source."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import pyarrow as pa
import yaml

from batchspec import __version__
from batchspec.observe.columns import Kept


def _size_category(rows: int) -> str:
    for limit, name in [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")]:
        if rows < limit:
            return name
    if rows < 1_000_000:
        return "100K<n<1M"
    return "1M<n<10M" if rows < 10_000_000 else "10M<n<100M"


COLUMN_DOCS = {
    "sample_index": "which of the prompt's `sampling.n` samples the row is, 0..n-1 (0 with one "
    "sample per prompt); a prompt's samples are consecutive rows, each with a seed of its own",
    "generated_text": "the completion (null in an error row)",
    "replayed_k": "the K (draft tokens per step) the row was replayed at: the job's `k_grid`; "
    "null where the row was not replayed (error rows, drafts that need a model, rows left out "
    "to keep replay under 1% of generation time)",
    "replayed_accepted": "per K of `replayed_k`, the draft tokens the job's drafter, replayed "
    "over this row's prompt and output, would have had accepted (at the K that ran: the real "
    "count, less the 1-2 drafts the engine counts past the row's end where an EOS or "
    "`max_tokens` cut an accepted draft; sampled rows at other K: an unbiased estimate)",
    "num_prompt_tokens": "prompt tokens the model read, after the chat template",
    "num_output_tokens": "tokens generated",
    "finish_reason": "`stop` (end of sequence or a stop string) or `length` (`max_tokens`)",
    "engine": "the engine that generated the row: `vllm` or batchspec's own `tree` (with "
    "`engine: auto` a rerun may switch); null where the prompt failed before any engine, and in "
    "parts written before batchspec recorded it",
    "spec_method": "the speculative method the row ran with: `none` without speculation, "
    "`<method>-tree` on the tree engine",
    "num_speculative_tokens": "K, the draft tokens proposed per verify step (on the tree "
    "engine the tree's node budget); 0 without speculation",
    "num_spec_steps": "verify steps that checked at least one draft token",
    "num_draft_tokens": "draft tokens proposed (on the tree engine: tree nodes verified)",
    "num_accepted_tokens": "draft tokens the model accepted (at most `num_draft_tokens`)",
    "acceptance_rate": "`num_accepted_tokens / num_draft_tokens`",
    "mean_acceptance_length": "`1 + num_accepted_tokens / num_spec_steps`: tokens per verify step",
    "acceptance_histogram": "verify steps by the number of drafts accepted, index 0..K (tree "
    "engine: by accepted depth); sums to `num_spec_steps`",
    "logprobs": "per generated token, a list of (token_id, logprob): the generated token's "
    "first, then the target's top `sampling.logprobs` tokens, best first; raw model "
    "log-probabilities (before penalties, temperature, top-k/top-p), null unless asked",
    "prompt_logprobs": "the same per prompt token (`sampling.prompt_logprobs`, vLLM; the "
    "first prompt token's list is empty); null unless asked",
    "queue_s": "seconds the row waited in the engine before it was first scheduled",
    "ttft_s": "seconds from queued to the first token",
    "decode_s": "seconds from the first to the last token",
    "e2e_s": "seconds from queued to the last token",
    "output_tokens_per_s": "`num_output_tokens / (e2e_s - queue_s)`: the row's speed once "
    "scheduled",
    "error": "why the row has no generation (prompt null or too long, malformed messages, "
    "rejected by the engine); null when it has one, and every generation column null when set",
    "unit_id": "the work unit that generated the row (its part is `parts/<unit_id>.parquet` "
    "in the run's output directory)",
}
"""One sentence per output column after id, domain and the pass-through columns."""


def describe(name: str, inp: dict[str, Any]) -> str:
    """What column ``name`` of the dataset holds, for the job's input section ``inp``."""
    system = inp.get("system_prompt")
    if name == inp.get("prompt_column"):
        templated = inp.get("apply_chat_template", True)
        how = "as one user turn through its chat template" if templated else "as raw text"
        after = ", after the job's `system_prompt`" if templated and system else ""
        return (
            f"the prompt, as the input's `{name}` column holds it; the model read it {how}{after}"
        )
    if name == inp.get("messages_column"):
        return (
            f"the chat, as the input's `{name}` column holds it: a list of `{{role, content}}`; "
            "the model read it through its chat template and answered the last turn"
            + (", the job's `system_prompt` first where a chat has none" if system else "")
        )
    if name == "id":
        return f"the input row's id (input column `{inp.get('id_column')}`)"
    if name == "domain":
        source = inp.get("domain_column")
        return f"the row's domain (input column `{source}`)" if source else "null: no domains"
    if name in (inp.get("passthrough_columns") or []):
        return f"copied from the input's `{name}` column"
    return COLUMN_DOCS.get(name, "(not described by this batchspec version)")


def type_name(t: pa.DataType) -> str:
    """A column's type as a reader of the card thinks of it: ``list<int32>``, ``float64``,
    ``list<struct<role: string, content: string>>`` (no Arrow item names, which Parquet
    renames, nor large or view variants, which a polars-written input has)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list<{type_name(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {type_name(f.type)}" for f in t) + ">"
    return _PLAIN.get(str(t), str(t))


_PLAIN = {
    "double": "float64",
    "float": "float32",
    "halffloat": "float16",
    "large_string": "string",
    "string_view": "string",
    "large_binary": "binary",
    "binary_view": "binary",
}
"""Arrow's names for how a type is held (offset widths, views) are no matter to a reader."""


def columns_table(inp: dict[str, Any], schema: pa.Schema, null: Collection[str] = ()) -> str:
    """The ``| column | type | meaning |`` table, one row per column, in the data's order;
    ``null``: the columns null in every row, said so (a reader should not look for values)."""
    rows = [
        f"| `{f.name}` | `{type_name(f.type)}` | {describe(f.name, inp)}"
        + ("; null in every row of this dataset" if f.name in null else "")
        + " |"
        for f in schema
    ]
    return "| column | type | meaning |\n| --- | --- | --- |\n" + "\n".join(rows)


def kept_columns(kept: Kept) -> str:
    """The card's line on ``--columns``: the profile or names, and what was left out."""
    if not kept.left_out:
        return f"all {len(kept.schema)} of the run's columns (`--columns {kept.asked}`)"
    shown = [f"`{n}`" for n in kept.left_out if n not in kept.empty]
    line = (
        f"{len(kept.schema)} of the run's {len(kept.schema) + len(kept.left_out)} "
        f"(`--columns {kept.asked}`); left out: {', '.join(shown) or 'nothing else'}"
    )
    if kept.empty:
        empty = ", ".join(f"`{n}`" for n in kept.empty)
        line += f"; and, null in every row of the run, {empty}"
    return line


def no_acceptance(counts: dict[str, Any]) -> str:
    """Why rows with a generation can have null acceptance figures: nothing was drafted."""
    return f"""Rows with a generation can still have nulls in the acceptance columns: nothing was
drafted that could be accepted, and a made-up 0 would read as a measured failure.

- **No speculation** (`num_speculative_tokens` 0, `spec_method` `none`): the job's method is
  `none`, or the K controller chose K = 0 for the row's domain because drafting did not pay
  there. `num_spec_steps`, `num_draft_tokens`, `num_accepted_tokens`, `acceptance_rate`,
  `mean_acceptance_length` and `acceptance_histogram` are all null.
- **Speculation on, nothing drafted** (K > 0, `num_draft_tokens` 0): an n-gram drafter found no
  match in the row's context, or the row ended (end of sequence, a stop string, `max_tokens`)
  before any step drafted. `acceptance_rate` and `mean_acceptance_length` are null (0 / 0).

In this dataset {counts["no_acceptance_rows"]} row(s) with a generation have no
`acceptance_rate`. Error rows (`error` set) have every generation column null."""


def header(rows: int) -> str:
    meta = {
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": "train", "path": "data/train-*"}],
            }
        ],
        "tags": ["synthetic", "batchspec"],
        "size_categories": [_size_category(rows)],
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def summary(spec: dict[str, Any], kept: Kept, counts: dict[str, Any]) -> str:
    """The card's list: rows, prompts, columns, checks, errors, model, speculation,
    sampling."""
    model, spec_s, sampling = spec["model"], spec["speculative"], spec["sampling"]
    errors = (
        f"{counts['error_rows']} error rows kept (`error` set, generation columns null)"
        if counts["errors_kept"]
        else f"{counts['error_rows']} error rows left out (`--drop-errors`)"
    )
    missing = (
        f"\n- **unfinished run**: {counts['missing_rows']} input rows were not generated yet"
        if counts["missing_rows"]
        else ""
    )
    draft = f", draft `{spec_s['model']}`" if spec_s.get("model") else ""
    source = spec["input"].get("prompt_column") or spec["input"].get("messages_column")
    why = "`--columns`" if source in kept.left_out else "`--no-prompts`"
    prompts = (
        f"the input's `{source}` column, beside the generation"
        if source in kept.schema.names
        else f"left out ({why}): they are the input's `{source}` column"
    )
    return f"""\
- **rows**: {counts["rows"]}, in input order, in {counts["shards"]} Parquet shard(s) under `data/`
- **prompts**: {prompts}
- **columns**: {kept_columns(kept)}
- **checked at export**: every input id appears exactly once
- **error rows**: {errors}{missing}
- **model**: `{model["model"]}`, dtype `{model["dtype"]}`, batch `{model["max_num_seqs"]}`
- **speculative decoding**: `{spec_s["method"]}`, K `{spec_s["num_speculative_tokens"]}`,
  adaptive `{spec_s.get("adaptive")}`{draft}
- **sampling**: temperature `{sampling["temperature"]}`, top_p `{sampling.get("top_p")}`,
  max_tokens `{sampling["max_tokens"]}`, seed `{sampling.get("seed")}`{_more_sampling(sampling)}"""


def _more_sampling(sampling: dict[str, Any]) -> str:
    """The sampling keys a synthetic-data job adds, where set (n, per-row columns, penalties,
    logprobs, structured output)."""
    quiet = {"n": 1, "columns": {}, "min_tokens": 0, "repetition_penalty": 1.0}
    quiet |= {"frequency_penalty": 0.0, "presence_penalty": 0.0}
    keys = [*quiet, "logprobs", "prompt_logprobs", "json_schema", "regex", "choice"]
    shown = [
        f"{k} `{json.dumps(sampling[k])}`"
        for k in keys
        if sampling.get(k, quiet.get(k)) not in (None, quiet.get(k))
    ]
    return (",\n  " + ", ".join(shown)) if shown else ""


def dataset_card(job: dict[str, Any], kept: Kept, counts: dict[str, Any], table_md: str) -> str:
    """The whole card; ``counts``: rows, error_rows, errors_kept, missing_rows, shards,
    no_acceptance_rows, null_columns. Why rows lack acceptance figures only where the
    acceptance columns were kept."""
    spec = job["spec"]
    why = (
        f"\n## Why some rows have no acceptance\n\n{no_acceptance(counts)}\n"
        if "acceptance_rate" in kept.schema.names
        else ""
    )
    name = spec.get("name") or "batchspec dataset"
    return f"""{header(counts["rows"])}
# {name}

Generated with batchspec {__version__}: every input row answered by the model below, with
speculative decoding (lossless: the model's own output distribution).

{summary(spec, kept, counts)}

Load it with `datasets.load_dataset("<this folder>")` (the header above names the files),
or `load_dataset("parquet", data_files="<this folder>/data/*.parquet")`.

## Per-domain report

{table_md}

`acc_rate`: accepted / drafted tokens; `mean_acc_len`: tokens per verify step; `K_used`: the
K its rows ran with; `row_tok/s`: median decode speed of a row; `p50_s`, `p95_s`: row latency
(queued to last token) percentiles.

## Columns

{columns_table(spec["input"], kept.schema, counts.get("null_columns", []))}
{why}
## Job spec

```yaml
{yaml.safe_dump(spec, sort_keys=False).rstrip()}
```
"""
