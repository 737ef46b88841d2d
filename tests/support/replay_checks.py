"""The replay check of a finished run (issue 22), shared by the engine tests that run one."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl


def assert_replay_exact(out: Path, grid: list[int]) -> None:
    """Rows were replayed at every K of ``grid``, and in every engine the run log counts, the
    replay at the K that ran equals the engine's own count on every comparable row."""
    parts = pl.read_parquet(out / "parts")
    replayed = parts.filter(pl.col("replayed_k").is_not_null())
    assert replayed.height > 0
    assert all(ks == grid for ks in replayed["replayed_k"].to_list())
    logs = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    engines = [e for log in logs for e in log["engines"]]
    checked = sum(e["replay_checked"] for e in engines)
    assert checked > 0 and sum(e["replay_equal"] for e in engines) == checked, engines
