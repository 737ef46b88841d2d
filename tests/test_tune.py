"""batchspec tune and the K controller on real vLLM: measured sweeps, tuned K in the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DOMAINS, IN_PROCESS_ENGINE, run_cli, small_job

from batchspec.io.layout import OutDir

pytestmark = pytest.mark.engine


def test_tune_measures_every_k_of_the_grid(tmp_path: Path) -> None:
    job = small_job(tmp_path, 4, speculative={"k_grid": [0, 3]}, sampling={"max_tokens": 16})
    result = run_cli("tune", str(job), "--sample", "4", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured output tokens/s per domain and K" in result.stdout
    data = json.loads(OutDir(tmp_path / "out").tuning.read_text())
    assert data["method"] == "ngram" and data["k_grid"] == [0, 3]
    (entry,) = data["batches"]
    assert entry["batch"] == 8 and sorted(entry["domains"]) == DOMAINS
    for d in entry["domains"].values():
        assert set(d["tokens_per_s"]) == {"0", "3"} and all(
            v > 0 for v in d["tokens_per_s"].values()
        )
        assert d["chosen_k"] in (0, 3) and 0 < d["alpha"] < 1
    assert len(entry["observations"]) == 12
    assert all(o["rows"] == 4 and o["output_tokens"] > 0 for o in entry["observations"])
