"""The dataset card (``README.md``) of an exported dataset: the YAML header ``datasets`` and
the Hub read (its ``configs`` name the data files), then what made the rows: job, model,
speculative settings, sampling, and the per-domain report table."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import yaml

from batchspec import __version__


def _size_category(rows: int) -> str:
    for limit, name in [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")]:
        if rows < limit:
            return name
    if rows < 1_000_000:
        return "100K<n<1M"
    return "1M<n<10M" if rows < 10_000_000 else "10M<n<100M"


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


def dataset_card(
    job: dict[str, Any],
    schema: pa.Schema,
    counts: dict[str, Any],
    table_md: str,
) -> str:
    """The whole card; ``counts``: rows, error_rows, errors_kept, missing_rows, shards."""
    spec = job["spec"]
    model, spec_s, sampling = spec["model"], spec["speculative"], spec["sampling"]
    name = spec.get("name") or "batchspec dataset"
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
    columns = "\n".join(f"| `{f.name}` | `{f.type}` |" for f in schema)
    return f"""{header(counts["rows"])}
# {name}

Generated with batchspec {__version__}: every input row answered by the model below, with
speculative decoding (lossless: the model's own output distribution).

- **rows**: {counts["rows"]}, in input order, in {counts["shards"]} Parquet shard(s) under `data/`
- **checked at export**: every input id appears exactly once
- **error rows**: {errors}{missing}
- **model**: `{model["model"]}`, dtype `{model["dtype"]}`, batch `{model["max_num_seqs"]}`
- **speculative decoding**: `{spec_s["method"]}`, K `{spec_s["num_speculative_tokens"]}`,
  adaptive `{spec_s.get("adaptive")}`{draft}
- **sampling**: temperature `{sampling["temperature"]}`, top_p `{sampling.get("top_p")}`,
  max_tokens `{sampling["max_tokens"]}`, seed `{sampling.get("seed")}`

Load it with `datasets.load_dataset("<this folder>")` (the header above names the files),
or `load_dataset("parquet", data_files="<this folder>/data/*.parquet")`.

## Per-domain report

{table_md}

`acc_rate`: accepted / drafted tokens; `mean_acc_len`: tokens per verify step; `K_used`: the
K its rows ran with; `row_tok/s`: median decode speed of a row; `p50_s`, `p95_s`: row latency
(queued to last token) percentiles.

## Columns

| column | type |
| --- | --- |
{columns}

## Job spec

```yaml
{yaml.safe_dump(spec, sort_keys=False).rstrip()}
```
"""
