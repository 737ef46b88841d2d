"""batchspec verify on real vLLM (the embedded model, engines in the CLI's process): n-gram
speculation passes the greedy check and the sampled two-sample test; with ``--full``, a
planted broken sampler (every draft token accepted, ``engines.planted``) fails both. The
fuller figures (bf16, draft-model speculation, more prompts) come from
``scripts/checks/vllm_methods.py --verify-only --dtype bfloat16``."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import IN_PROCESS_ENGINE, PROMPTS, job_dict, run_cli, small_job, write_job

from batchspec.engines.planted import ACCEPT_ALL_ENV

pytestmark = pytest.mark.engine

BIASED = IN_PROCESS_ENGINE | {ACCEPT_ALL_ENV: "1"}


def report(out: Path) -> dict:
    (path,) = sorted((out / "verify").glob("report-*.json"))
    return json.loads(path.read_text())


def test_greedy_ngram_passes_and_a_planted_bias_fails(tmp_path: Path, full: bool) -> None:
    """Real n-gram speculation gives the target's tokens on every row. The planted bias (every
    draft accepted, vLLM's sampler patched) runs with ``--full``: ~40-70 s of the suite for a
    failure the same ``verify`` comparison is shown to catch by default on the tree engine
    (``test_tree_engine``'s greedy planted bias)."""
    job = small_job(tmp_path, 1, sampling={"max_tokens": 16})
    ok = run_cli("verify", str(job), "--rows", "6", env=IN_PROCESS_ENGINE)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "verify: pass" in ok.stdout
    assert ok.stderr.strip() == "", ok.stderr[-3000:]  # the engines' output: in runs/verify-*.log
    (check,) = report(tmp_path / "out")["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 6
    if not full:
        return
    bad = run_cli("verify", str(job), "--rows", "6", "--output", str(tmp_path / "b"), env=BIASED)
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert "verify: FAIL" in bad.stdout
    (check,) = report(tmp_path / "b")["checks"]
    # float32 requires identity: every divergence is a failure, and each names its position
    # and the target's margin there.
    assert check["failures"] > 0 and check["near_ties"] == 0
    assert all(d["position"] >= 1 for d in check["divergences"])


def near_tie_job(tmp: Path, name: str, speculative: dict | None = None) -> Path:
    """``math-0001`` at temperature 1, written as ``tmp/<name>``: its answer starts by
    quoting it ("Maria has ..."), so n-gram drafts exist from the second generated token on,
    where the target gives " has" 0.41 and " gives" 0.40: a sampled check that tells."""
    df = pl.read_parquet(PROMPTS).filter(pl.col("id") == "math-0001")
    df.write_parquet(tmp / "in.parquet")
    job = job_dict(
        tmp / "out",
        input={"path": str(tmp / "in.parquet")},
        model={"max_num_seqs": 32},
        sampling={"temperature": 1.0},
        **({"speculative": speculative} if speculative else {}),
    )
    return write_job(tmp / name, job)


def test_sampled_ngram_passes_and_a_planted_bias_fails(tmp_path: Path, full: bool) -> None:
    """``near_tie_job``: real speculation keeps the target's distribution at its near-tie (it
    did not before ``engines.vllm_fixes``: vLLM's CPU build gave " has" 0.75 and " gives" 0);
    accepting every draft moves it by a total variation of ~0.3, far above what 150 samples
    detect."""
    path = near_tie_job(tmp_path, "job.yaml")
    args = ["--rows", "1", "--samples", "150", "--tokens", "2"]
    ok = run_cli("verify", str(path), *args, env=IN_PROCESS_ENGINE)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    (check,) = report(tmp_path / "out")["checks"]
    assert check["check"] == "sampled" and check["rejected"] == 0
    if not full:
        return  # the planted sampled bias is caught by default on the tree engine's test
    bad = run_cli("verify", str(path), *args, "--output", str(tmp_path / "b"), env=BIASED)
    assert bad.returncode == 1, bad.stderr[-3000:]
    (check,) = report(tmp_path / "b")["checks"]
    assert check["check"] == "sampled" and check["rejected"] > 0
    hit = next(t for t in check["details"] if t["p_holm"] < 0.05)
    assert hit["position"] == 1 and hit["tv"] > hit["detectable_tv"] / 2


def test_verify_refuses_a_job_without_speculation(tmp_path: Path) -> None:
    job = small_job(tmp_path, 1, speculative={"method": "none"})
    result = run_cli("verify", str(job))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "batchspec: error: speculative.method is none: there is no speculation to verify"
    ]
