"""Build the prompt sets under ``jobs/data/``, deterministically, from data in this repository
(no downloads), or check that a shipped file is its build (``--check``: exit 1 if it differs):

- ``prompts``: the default set, ``prompts.parquet``, from ``prompts.jsonl`` (authored by hand:
  ``id`` as ``<domain>-NNNN``, ``domain``, ``messages`` as OpenAI-style chat turns, the last the
  user's request; six domains of 60 prompts in clear, simple language for the tiny target).
  The Parquet file adds ``prompt`` (the last user turn) and ``source`` (``authored-v1``). Edit
  the JSONL, then rebuild.
- ``long``: the long-context set, ``prompts_long.parquet`` (``long_prompts.py``).
- ``extract``: ``extract.parquet`` for ``jobs/synth_extract.yaml``: short notes about a person,
  each asking for the name, age and city as JSON; ``expected`` keeps the true values.
- ``records``: ``records.parquet`` for ``jobs/synth_records.yaml``: six task templates filled in
  40 times each, shaped like users' synthetic-data jobs (``records.py``).
- ``stdlib``: ``stdlib.parquet`` for ``jobs/synth_stdlib.yaml``, the held-out set: passages of the
  Python reference and stdlib functions' source, text the project never wrote (``stdlib.py``).

    python scripts/data/build.py prompts            # writes jobs/data/prompts.parquet
    python scripts/data/build.py prompts --check    # exit 1 if the Parquet is not the JSONL's
    .venv/bin/python scripts/data/build.py long --check
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA = Path(__file__).resolve().parents[2] / "jobs" / "data"
DOMAINS = ("chat", "code", "math", "qa", "summarization", "translation")
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
CHAT_SCHEMA = pa.schema([pa.field(n, t, nullable=False) for n, t in [
    ("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string()),
    ("messages", MESSAGES), ("source", pa.string())]])  # fmt: skip
"""The default set's columns, and the long set's."""


def prompts(jsonl: Path) -> pa.Table:
    """The default set, checked: ids unique and per domain, 60 rows each, chats that end with a
    non-empty user turn, no prompt twice; rows sorted by id."""
    rows = []
    for n, line in enumerate(jsonl.read_text().splitlines(), 1):
        item = json.loads(line)
        last = item["messages"][-1]
        if last["role"] != "user" or not last["content"].strip():
            raise ValueError(f"{jsonl}:{n}: the last message must be a non-empty user turn")
        if not item["id"].startswith(f"{item['domain']}-"):
            raise ValueError(f"{jsonl}:{n}: id {item['id']!r} is not of domain {item['domain']}")
        rows.append({**item, "prompt": last["content"], "source": "authored-v1"})
    counts = Counter(r["domain"] for r in rows)
    if counts != dict.fromkeys(DOMAINS, 60):
        raise ValueError(f"{jsonl}: expected 60 rows per domain, got {dict(counts)}")
    for key in ("id", "prompt"):
        dupes = [v for v, c in Counter(r[key] for r in rows).items() if c > 1]
        if dupes:
            raise ValueError(f"{jsonl}: duplicate {key}: {dupes[0]!r}")
    return pa.Table.from_pylist(sorted(rows, key=lambda r: r["id"]), schema=CHAT_SCHEMA)


NAMES = ["Maria Lopez", "Tom Becker", "Aiko Tanaka", "Samuel Okafor", "Lena Novak",
         "Ravi Patel", "Clara Jensen", "Omar Haddad", "Julia Rossi", "Ken Brown"]  # fmt: skip
CITIES = ["Lyon", "Oslo", "Osaka", "Lagos", "Prague", "Pune", "Aarhus", "Beirut", "Turin",
          "Denver"]  # fmt: skip
JOBS = ["baker", "nurse", "teacher", "pilot", "painter", "chemist", "gardener", "librarian"]
NOTES = [
    "{name} is {age} years old and lives in {city}, where {they} works as a {job}.",
    "Last year {name} moved to {city}. {They} is a {job} and turned {age} in May.",
    "A {job} from {city}, {name} ({age}) likes long walks by the river.",
    "Our new neighbour is {name}. {They} is {age}, works as a {job} and comes from {city}.",
]
ASK = ('Read the note and give the person\'s name, age and city as a JSON object with the keys '
       '"name", "age" and "city".\n\nNote: ')  # fmt: skip


def extract() -> pa.Table:
    """40 notes from the fixed lists above, with a fixed seed."""
    rng, rows = random.Random("extract-v1"), []
    for i in range(40):
        name, city = NAMES[i % len(NAMES)], CITIES[(i * 3 + 1) % len(CITIES)]
        age, job = rng.randint(19, 78), rng.choice(JOBS)
        they = "she" if name.split()[0] in {"Maria", "Aiko", "Lena", "Clara", "Julia"} else "he"
        note = NOTES[i % len(NOTES)].format(name=name, age=age, city=city, job=job, they=they,
                                            They=they.capitalize())  # fmt: skip
        expected = json.dumps({"name": name, "age": age, "city": city})
        rows.append({"id": f"extract-{i:04d}", "prompt": ASK + note, "expected": expected})
    schema = pa.schema([pa.field(n, pa.string(), nullable=False)
                        for n in ("id", "prompt", "expected")])  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("set", choices=["prompts", "long", "extract", "records", "stdlib"])
    ap.add_argument("--jsonl", type=Path, default=DATA / "prompts.jsonl", help="prompts, long")
    ap.add_argument("--out", type=Path, help="default: the set's file in jobs/data/")
    ap.add_argument("--short", type=int, default=40, help="long: rows per short domain")
    ap.add_argument("--tokens", type=int, default=750, help="long: long rows' prompt tokens (~)")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args()
    out = args.out or DATA / f"{'prompts_long' if args.set == 'long' else args.set}.parquet"
    if args.set == "long":
        from long_prompts import build, describe

        table = build(args.jsonl, args.short, args.tokens)
    elif args.set == "records":
        from records import build as records

        table = records()
    elif args.set == "stdlib":
        from stdlib import build as stdlib

        table = stdlib()
    else:
        table = prompts(args.jsonl) if args.set == "prompts" else extract()
    if args.check:
        same = out.is_file() and pq.read_table(out).equals(table)
        print(f"{out}: {'matches' if same else 'DIFFERS FROM'} this build (Python "
              f"{sys.version.split()[0]})")  # fmt: skip
        return 0 if same else 1
    pq.write_table(table, out, compression="zstd")
    counts = dict(Counter(table["domain"].to_pylist())) if "domain" in table.column_names else ""
    print(f"wrote {table.num_rows} rows to {out} {counts}")
    print(describe(table) if args.set == "long" else "", end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
