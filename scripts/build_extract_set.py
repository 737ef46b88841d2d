"""Build the extraction prompt set, ``jobs/data/extract.parquet``, for ``jobs/synth_extract.yaml``.

Short notes about a person, each asking for the person's name, age and city as JSON: the
job's ``sampling.json_schema`` holds every answer to that shape. Authored here from fixed
lists (no downloads, no randomness beyond a fixed seed), so the file is deterministic; the
``expected`` column keeps the true values beside each prompt (passed through to the output)::

    python scripts/build_extract_set.py            # writes jobs/data/extract.parquet
    python scripts/build_extract_set.py --check    # exit 1 if the file differs from this build
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "jobs" / "data" / "extract.parquet"
ROWS = 40
NAMES = ["Maria Lopez", "Tom Becker", "Aiko Tanaka", "Samuel Okafor", "Lena Novak",
         "Ravi Patel", "Clara Jensen", "Omar Haddad", "Julia Rossi", "Ken Brown"]  # fmt: skip
CITIES = ["Lyon", "Oslo", "Osaka", "Lagos", "Prague", "Pune", "Aarhus", "Beirut", "Turin",
          "Denver"]  # fmt: skip
JOBS = ["baker", "nurse", "teacher", "pilot", "painter", "chemist", "gardener", "librarian"]
TEMPLATES = [
    "{name} is {age} years old and lives in {city}, where {they} works as a {job}.",
    "Last year {name} moved to {city}. {They} is a {job} and turned {age} in May.",
    "A {job} from {city}, {name} ({age}) likes long walks by the river.",
    "Our new neighbour is {name}. {They} is {age}, works as a {job} and comes from {city}.",
]
ASK = (
    "Read the note and give the person's name, age and city as a JSON object with the keys "
    '"name", "age" and "city".\n\nNote: '
)
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("expected", pa.string(), nullable=False),
    ]
)


def build() -> pa.Table:
    rng = random.Random("extract-v1")
    rows = []
    for i in range(ROWS):
        name, city = NAMES[i % len(NAMES)], CITIES[(i * 3 + 1) % len(CITIES)]
        age, job = rng.randint(19, 78), rng.choice(JOBS)
        they = "she" if name.split()[0] in {"Maria", "Aiko", "Lena", "Clara", "Julia"} else "he"
        note = TEMPLATES[i % len(TEMPLATES)].format(
            name=name, age=age, city=city, job=job, they=they, They=they.capitalize()
        )
        expected = json.dumps({"name": name, "age": age, "city": city})
        rows.append({"id": f"extract-{i:04d}", "prompt": ASK + note, "expected": expected})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args()
    table = build()
    if args.check:
        same = OUT.is_file() and pq.read_table(OUT).equals(table)
        print(f"{OUT}: {'matches' if same else 'DIFFERS FROM'} this build")
        return 0 if same else 1
    pq.write_table(table, OUT, compression="zstd")
    print(f"wrote {table.num_rows} rows to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
