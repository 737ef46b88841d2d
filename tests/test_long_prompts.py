"""The long-context prompt set is what its builder promises, read from the shipped file (no
tokenizer, no rebuild: ``scripts/data/build.py long --check`` compares a rebuild, ~5 s).

The short rows are the default set's own rows, unchanged (an edit of ``prompts.jsonl`` that
is not rebuilt here fails); every ``long_qa`` row keeps its source prompt's question and hides
its passage among other documents; long rows are long.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pyarrow.parquet as pq
from conftest import ROOT

LONG = ROOT / "jobs" / "data" / "prompts_long.parquet"
JSONL = ROOT / "jobs" / "data" / "prompts.jsonl"


def test_long_set_mixes_default_rows_and_long_contexts() -> None:
    rows = pq.read_table(LONG).to_pylist()
    counts = Counter(r["domain"] for r in rows)
    short = ("chat", "code", "math", "qa", "summarization", "translation")
    assert counts == {**dict.fromkeys(short, 40), "long_qa": 60, "long_summarization": 60}
    assert len({r["id"] for r in rows}) == len(rows)
    default = {d["id"]: d for d in map(json.loads, JSONL.read_text().splitlines())}
    for r in rows:
        if r["domain"] in short:
            assert r["messages"] == default[r["id"]]["messages"], r["id"]
            assert r["prompt"] == r["messages"][-1]["content"] and r["source"] == "authored-v1"
        else:
            assert r["source"] == "long-v1" and r["prompt"] == r["messages"][-1]["content"]
            # ~750 tokens (667 at least) of prose and documentation: > 1,600 characters.
            assert len(r["prompt"]) > 1600, (r["id"], len(r["prompt"]))
    qa = sorted((d for d in default.values() if d["domain"] == "qa"), key=lambda d: d["id"])
    for n, source in enumerate(qa, 1):
        mine = next(r for r in rows if r["id"] == f"long_qa-{n:04d}")
        paragraphs = source["messages"][-1]["content"].split("\n\n")
        passage = max(paragraphs, key=lambda p: len(p.split()))
        body = re.sub(r"^\w+\s*:\s*", "", passage).strip()
        text = mine["prompt"]
        assert body in text, mine["id"]
        assert text.count("Document ") >= 3, mine["id"]
        assert text.endswith(paragraphs[-1]), mine["id"]
        assert mine["messages"][:-1] == source["messages"][:-1]
