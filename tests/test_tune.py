"""batchspec tune on real engines: full batches measured at every K on vLLM and on the tree
engine (``speculative.engine: auto``), noise, the job's identity, and the run that follows on
the engine the tuning file routes it to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import DOMAINS, IN_PROCESS_ENGINE, run_cli, small_job

from batchspec.io.layout import OutDir

pytestmark = pytest.mark.engine


def test_tune_measures_both_engines_and_the_run_takes_the_faster(
    tmp_path: Path, full: bool
) -> None:
    """88 s alone at a load of 1-3, 316 s at 4-5, 546 s in a clean-clone CI at 5 (four engines,
    each measuring a fixed amount of work, then the run): runs with ``--full`` (the suite's
    time budget). By default the route's arithmetic is checked without engines
    (``test_route``), and the K the run takes per domain from a tuning file on real vLLM
    (``test_adaptive``)."""
    if not full:
        pytest.skip("tune on both engines: runs with --full")
    # 4 prompts per domain, batch 4: a sample of 2 rows is raised to the full batch.
    speculative = {"k_grid": [0, 3], "engine": "auto", "tree": {"max_depth": 3}}
    job = small_job(
        tmp_path, 4, speculative=speculative, sampling={"max_tokens": 16}, model={"max_num_seqs": 4}
    )
    # Two of the six domains: every measurement is per domain, and the suite's time counts.
    rows = pl.read_parquet(tmp_path / "in.parquet")
    rows.filter(pl.col("domain").is_in(TUNED)).write_parquet(tmp_path / "in.parquet")
    result = run_cli("tune", str(job), "--sample", "2", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured output tokens/s per domain and K" in result.stdout
    assert "speculative.engine auto routes" in result.stdout
    # The engines' own output (vLLM's logs, torch's notices) went to the log, not the terminal.
    assert result.stderr.strip() == "", result.stderr[-3000:]
    logs = list((tmp_path / "out" / "runs").glob("tune-*.log"))
    assert len(logs) == 1 and logs[0].stat().st_size > 0, logs
    data = json.loads(OutDir(tmp_path / "out").tuning.read_text())
    assert data["method"] == "ngram" and sorted(data["engines"]) == ["tree", "vllm"]
    assert data["identity"]["speculative.tree"]["max_depth"] == 3
    assert data["identity"]["sampling.max_tokens"] == 16
    for tuned in data["engines"].values():
        assert tuned["k_grid"] == [0, 3] and tuned["engine_build_s"] > 0
        assert tuned["sample_rows"] == {"4": 4}
        check_entry(tuned["batches"])
    (route,) = data["route"]
    rates = route["tokens_per_s"]
    assert route["batch"] == 4 and rates["vllm"] > 0 and rates["tree"] > 0
    assert route["engine"] == max(rates, key=lambda e: (rates[e], e == "vllm"))
    # The run takes the routed engine, and every unit it learns from is tagged with it.
    result = run_cli("run", str(job), "--limit", "8", "--no-progress", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    (log,) = (json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*.json"))
    assert {e["engine"] for e in log["engines"]} == {route["engine"]}
    stats = (tmp_path / "out" / "stats").glob("*.jsonl")
    tags = {json.loads(line)["engine"] for p in stats for line in p.read_text().splitlines()}
    assert tags == {route["engine"]}


TUNED = DOMAINS[:2]


def check_entry(batches: list[dict]) -> None:
    """One engine's measurements at batch 4: every domain at K=0 and 3, a full batch each."""
    (entry,) = batches
    assert entry["batch"] == 4 and sorted(entry["domains"]) == sorted(TUNED)
    for d in entry["domains"].values():
        rates, noise = d["tokens_per_s"], d["noise_tokens_per_s"]
        assert set(rates) == set(noise) == {"0", "3"} and all(v > 0 for v in rates.values())
        assert d["chosen_k"] in (0, 3) and 0 < d["alpha"] < 1
        # The choice never loses to the other measured K by more than the two noises.
        chosen, other = str(d["chosen_k"]), str(3 - d["chosen_k"])
        assert rates[other] - rates[chosen] <= math.hypot(noise[other], noise[chosen]) + 1e-9
    assert len(entry["observations"]) == 2 * len(TUNED)
    # Every K ran a full batch of each domain: its 4 prompts.
    assert all(o["rows"] == 4 and o["output_tokens"] > 0 for o in entry["observations"])
    assert all(o["rated"] == 4 for o in entry["observations"])
