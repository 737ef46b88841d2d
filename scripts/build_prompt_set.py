"""Build the default prompt set, ``jobs/data/prompts.parquet``, from ``jobs/data/prompts.jsonl``.

The prompts are data, authored by hand for this project (no downloads): one JSON object per
line with ``id`` (``<domain>-NNNN``), ``domain`` and ``messages`` (OpenAI-style chat turns,
the last one the user's request; some rows carry a system turn, about 10 % are multi-turn).
Six domains of 60 prompts each, in clear, simple language (the target model is tiny). The
Parquet file adds ``prompt`` (the last user turn's text) and ``source`` (``authored-v1``), and is
what jobs read. Edit the JSONL, then rebuild::

    python scripts/build_prompt_set.py            # writes jobs/data/prompts.parquet
    python scripts/build_prompt_set.py --check    # exit 1 if the Parquet is not the JSONL's

The output is deterministic: rows sorted by id, no randomness.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "authored-v1"
DOMAINS = ("chat", "code", "math", "qa", "summarization", "translation")
PER_DOMAIN = 60
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field(
            "messages",
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
            nullable=False,
        ),
        pa.field("source", pa.string(), nullable=False),
    ]
)


def build(jsonl: Path) -> pa.Table:
    """The prompt set as a table, checked: ids unique and per domain, 60 rows each, chats that
    end with a non-empty user turn, no prompt twice."""
    rows = []
    for n, line in enumerate(jsonl.read_text().splitlines(), 1):
        item = json.loads(line)
        messages = item["messages"]
        if messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            raise ValueError(f"{jsonl}:{n}: the last message must be a non-empty user turn")
        if not item["id"].startswith(f"{item['domain']}-"):
            raise ValueError(f"{jsonl}:{n}: id {item['id']!r} is not of domain {item['domain']}")
        prompt = messages[-1]["content"]
        rows.append({**item, "prompt": prompt, "messages": messages, "source": SOURCE})
    counts = Counter(r["domain"] for r in rows)
    if counts != dict.fromkeys(DOMAINS, PER_DOMAIN):
        raise ValueError(f"{jsonl}: expected {PER_DOMAIN} rows per domain, got {dict(counts)}")
    for key in ("id", "prompt"):
        dupes = [v for v, c in Counter(r[key] for r in rows).items() if c > 1]
        if dupes:
            raise ValueError(f"{jsonl}: duplicate {key}: {dupes[0]!r}")
    rows.sort(key=lambda r: r["id"])
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", type=Path, default=ROOT / "jobs" / "data" / "prompts.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / "jobs" / "data" / "prompts.parquet")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args()
    table = build(args.jsonl)
    if args.check:
        same = pq.read_table(args.out).equals(table)
        print(f"{args.out}: {'matches' if same else 'DIFFERS FROM'} {args.jsonl}")
        return 0 if same else 1
    pq.write_table(table, args.out, compression="zstd")
    print(
        f"wrote {table.num_rows} rows to {args.out}: {dict(Counter(table['domain'].to_pylist()))}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
