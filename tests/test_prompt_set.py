"""The shipped prompt set is the build of its JSONL source (the data, not code, is edited)."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
from conftest import PROMPTS, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from build_prompt_set import build


def test_parquet_is_built_from_the_jsonl() -> None:
    built = build(PROMPTS.with_suffix(".jsonl"))
    assert built.num_rows == 360
    assert pq.read_table(PROMPTS).equals(built), "rebuild: python scripts/build_prompt_set.py"
