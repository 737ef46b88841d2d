"""batchspec's draft-tree engine end to end on the embedded model (float32, CPU): a tree job
runs through ``batchspec run`` with the same output columns as vLLM's; ``batchspec verify``
shows greedy trees token-identical to the same engine's plain decoding and sampled trees
distributed as plain sampling, and catches a planted bias (every first-ranked draft path
accepted)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import PROMPTS, job_dict, run_cli, small_job, write_job
from support.replay_checks import assert_replay_exact

from batchspec.engines.planted import ACCEPT_ALL_ENV

pytestmark = pytest.mark.engine

TREE = {"tree": {"max_depth": 4}, "num_speculative_tokens": 6, "adaptive": False}
"""Dynamic n-gram trees: the 6 most frequent continuations, up to 4 deep."""


SELF_DRAFT = {
    "method": "draft_model", "num_speculative_tokens": 4, "adaptive": False,
    "tree": {"max_depth": 3, "draft_layers": [i for i in range(30) if i not in (10, 14, 18)]},
}  # fmt: skip
"""Draft-model trees (EAGLE-2 growth, 4 nodes up to 3 deep) from the target without three of
its 30 layers: self-speculation, the only draft model at hand offline."""


def report(out: Path) -> dict:
    (path,) = sorted((out / "verify").glob("report-*.json"))
    return json.loads(path.read_text())


def test_tree_job_runs_with_the_usual_columns(tmp_path: Path) -> None:
    job = small_job(tmp_path, 1, speculative=TREE, sampling={"max_tokens": 24})
    result = run_cli("run", str(job))
    assert result.returncode == 0, result.stderr[-3000:]
    df = pl.read_parquet(tmp_path / "out" / "parts")
    assert df.height == 6 and df["error"].is_null().all()
    assert set(df["spec_method"]) == {"ngram-tree"} and set(df["num_speculative_tokens"]) == {6}
    assert set(df["engine"]) == {"tree"}
    for row in df.iter_rows(named=True):
        assert sum(row["acceptance_histogram"]) == row["num_spec_steps"]
        assert row["num_accepted_tokens"] <= row["num_draft_tokens"]
        assert 0 < row["num_output_tokens"] <= 24
    # The translation and summarization prompts quote their input: trees find drafts there.
    assert df["num_accepted_tokens"].sum() > 0
    # Replayed at every K of the grid, and at K=6 equal to the engine's counts (issue 22).
    assert_replay_exact(tmp_path / "out", [0, 1, 2, 3, 5, 6, 8])


def test_greedy_trees_are_identical_to_plain_decoding(tmp_path: Path) -> None:
    # At batch 1, where plain decoding runs the compiled one-row regions (onerow.py) and the
    # trees' verify forwards the eager multi-row path.
    job = small_job(
        tmp_path, 1, speculative=TREE, sampling={"max_tokens": 24}, model={"max_num_seqs": 1}
    )
    ok = run_cli("verify", str(job), "--rows", "6")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    (check,) = report(tmp_path / "out")["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 6
    bad = run_cli(
        "verify", str(job), "--rows", "6", "--output", str(tmp_path / "b"),
        "--set", "model.max_num_seqs=8", env={ACCEPT_ALL_ENV: "1"},
    )  # fmt: skip
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert report(tmp_path / "b")["checks"][0]["failures"] > 0


def test_draft_model_trees_are_identical_to_plain_decoding(tmp_path: Path) -> None:
    job = small_job(tmp_path, 1, speculative=SELF_DRAFT, sampling={"max_tokens": 16})
    ok = run_cli("verify", str(job), "--rows", "3")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    result = report(tmp_path / "out")
    (check,) = result["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 3
    (spec_run,) = [e for e in result["engines"] if e["k"] == 4]
    assert spec_run["method"] == "draft_model-tree"
    # Not vacuous: the draft's trees were accepted often (the 27-layer draft agrees a lot).
    assert spec_run["accepted"] > spec_run["drafted"] / 8 > 0, spec_run


def test_suffix_trees_are_identical_to_plain_decoding(tmp_path: Path) -> None:
    # Two prompts per domain: a domain's second row may draft from its first row's output.
    job = small_job(
        tmp_path, 2, speculative={**TREE, "method": "suffix"}, sampling={"max_tokens": 24}
    )
    ok = run_cli("verify", str(job), "--rows", "12")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    result = report(tmp_path / "out")
    (check,) = result["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 12
    (spec_run,) = [e for e in result["engines"] if e["k"] == 6]
    assert spec_run["method"] == "suffix-tree" and spec_run["accepted"] > 0, spec_run


@pytest.mark.parametrize("speculative", [TREE, SELF_DRAFT], ids=["ngram", "draft_model"])
def test_sampled_trees_pass_and_a_planted_bias_fails(
    tmp_path: Path, speculative: dict, full: bool
) -> None:
    """The prompt whose answer starts by quoting it ("Maria has ..."): n-gram trees draft
    from the second token on. Draft-model trees (the same acceptance code, other trees) run
    with ``--full`` only (the suite's time budget)."""
    if speculative is SELF_DRAFT and not full:
        pytest.skip("sampled draft-model trees: ~60 s, runs with --full")
    pl.read_parquet(PROMPTS).filter(pl.col("id") == "math-0001").write_parquet(
        tmp_path / "in.parquet"
    )
    job = job_dict(
        tmp_path / "out",
        input={"path": str(tmp_path / "in.parquet")},
        model={"max_num_seqs": 32},
        speculative=speculative,
        sampling={"temperature": 1.0},
    )
    path = write_job(tmp_path / "job.yaml", job)
    # The check's false-positive rate is its alpha, 0.05, by design. At 150 samples the
    # draft-model run rejected position 0 (p 0.015, Holm 0.03), a token both engines sample
    # plainly from the same prefill: a false positive; 300 samples (more power) pass.
    samples = "150" if speculative is TREE else "300"
    args = ["--rows", "1", "--samples", samples, "--tokens", "2"]
    ok = run_cli("verify", str(path), *args)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    assert report(tmp_path / "out")["checks"][0]["rejected"] == 0
    bad = run_cli(
        "verify", str(path), *args, "--output", str(tmp_path / "b"), env={ACCEPT_ALL_ENV: "1"}
    )
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert report(tmp_path / "b")["checks"][0]["rejected"] > 0


def test_the_drafters_chosen_per_domain_are_identical_to_plain_decoding(tmp_path: Path) -> None:
    """``speculative.drafters``: ``verify`` deals the rows out to one unit per drafter in one
    batch of one engine (n-gram and suffix trees loaded once, each unit drafting with its
    own), and every row is plain decoding's. (The choice itself: ``test_drafters.py``; a run
    and its report: ``test_drafter_view.py``.)"""
    quoting = pl.col("domain").is_in(["summarization", "translation"])  # drafts land there
    rows = pl.read_parquet(PROMPTS).filter(quoting).group_by("domain", maintain_order=True)
    rows.head(2).write_parquet(tmp_path / "in.parquet")
    drafters = {"method": "suffix", "drafters": ["ngram", "suffix"], "adaptive": True}
    job = job_dict(
        tmp_path / "out",
        input={"path": str(tmp_path / "in.parquet")},
        speculative={**TREE, **drafters},
        sampling={"max_tokens": 16},
    )
    ok = run_cli("verify", str(write_job(tmp_path / "job.yaml", job)), "--rows", "4")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    result = report(tmp_path / "out")
    (check,) = result["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 4
    (spec_run,) = [e for e in result["engines"] if e["k"] == 6]
    assert set(spec_run["by_drafter"]) == {"ngram", "suffix"} and spec_run["accepted"] > 0
