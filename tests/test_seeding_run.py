"""A resumed suffix-tree job on the embedded model drafts from what the first run committed
(``work/seeding.py``): the rows it regenerates are the first run's, token for token, with
drafts from the seeded index where the first run had none, and replay equal to the engine's
counts on every row (the replay learned the same seed)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import run_cli, run_logs, small_job

pytestmark = pytest.mark.engine

SUFFIX = {
    "method": "suffix", "tree": {"max_depth": 4}, "num_speculative_tokens": 6,
    "adaptive": False,
}  # fmt: skip
DOMAINS = ["chat", "math"]


def test_a_resumed_run_drafts_from_the_committed_parts(tmp_path) -> None:
    job = small_job(tmp_path, 2, speculative=SUFFIX, sampling={"max_tokens": 24})
    job.write_text(job.read_text().replace("unit_rows: 4", "unit_rows: 1"))  # a unit per row
    rows = pl.read_parquet(tmp_path / "in.parquet")  # two domains, two rows each
    rows.filter(pl.col("domain").is_in(DOMAINS)).write_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out"
    first = run_cli("run", str(job))
    assert first.returncode == 0, first.stderr[-3000:]
    before = pl.read_parquet(out / "parts").sort("id")
    # The first row of each domain drafted from an empty index in the first run: take it out,
    # as a run killed before committing it would have left the directory.
    firsts = before.group_by("domain").agg(pl.col("unit_id").min())["unit_id"].to_list()
    for unit_id in firsts:
        (out / "parts" / f"{unit_id}.parquet").unlink()
    second = run_cli("run", str(job))
    assert second.returncode == 0, second.stderr[-3000:]
    after = pl.read_parquet(out / "parts").sort("id")
    assert after["generated_text"].to_list() == before["generated_text"].to_list()
    (fresh,), (resumed,) = (log["engines"] for log in run_logs(out))
    assert fresh["seeded_rows"] == 0 and resumed["seeded_rows"] == len(DOMAINS), resumed
    assert resumed["seeded_tokens"] > 0
    redone = [df.filter(pl.col("unit_id").is_in(firsts)) for df in (before, after)]
    drafted = [df["num_draft_tokens"].fill_null(0).sum() for df in redone]
    assert drafted[1] > drafted[0], drafted
    assert resumed["replay_checked"] == resumed["replay_equal"] > 0, resumed
