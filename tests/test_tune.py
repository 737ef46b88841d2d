"""batchspec tune on real vLLM: full batches measured at every K, noise, the job's identity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import DOMAINS, IN_PROCESS_ENGINE, run_cli, small_job

from batchspec.io.layout import OutDir

pytestmark = pytest.mark.engine


def test_tune_measures_every_k_of_the_grid_at_a_full_batch(tmp_path: Path) -> None:
    # 4 prompts per domain, batch 8: each domain's batch repeats its rows to fill it (a
    # sample of 2 rows is raised to the full batch).
    job = small_job(tmp_path, 4, speculative={"k_grid": [0, 3]}, sampling={"max_tokens": 16})
    result = run_cli("tune", str(job), "--sample", "2", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured output tokens/s per domain and K" in result.stdout
    data = json.loads(OutDir(tmp_path / "out").tuning.read_text())
    assert data["method"] == "ngram" and data["k_grid"] == [0, 3]
    assert data["identity"]["sampling.max_tokens"] == 16 and data["sample_rows"] == {"8": 8}
    (entry,) = data["batches"]
    assert entry["batch"] == 8 and sorted(entry["domains"]) == DOMAINS
    for d in entry["domains"].values():
        rates, noise = d["tokens_per_s"], d["noise_tokens_per_s"]
        assert set(rates) == set(noise) == {"0", "3"} and all(v > 0 for v in rates.values())
        assert d["chosen_k"] in (0, 3) and 0 < d["alpha"] < 1
        # The choice never loses to the other measured K by more than the two noises.
        chosen, other = str(d["chosen_k"]), str(3 - d["chosen_k"])
        assert rates[other] - rates[chosen] <= math.hypot(noise[other], noise[chosen]) + 1e-9
    assert len(entry["observations"]) == 12
    # Every K ran a full batch of each domain: 8 rows, of 4 distinct prompts.
    assert all(o["rows"] == 8 and o["output_tokens"] > 0 for o in entry["observations"])
    assert all(o["rated"] == 4 for o in entry["observations"])
