"""End to end on real vLLM (CPU build) and the embedded model, through the real CLI.

One run serves many checks (an engine start costs ~20 s here): a mixed-domain input with bad
rows and n-gram speculation, then reruns. Rows generated at K=0 are checked in test_tune.py,
whose run has engines at K=0 and K=3 anyway.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import IN_PROCESS_ENGINE, PROMPTS, job_dict, run_cli, write_job
from support.replay_checks import assert_replay_exact

from batchspec.engines.vllm_steps import MIN_STEPS
from batchspec.io.layout import OutDir
from batchspec.models import embedded_dir
from batchspec.speculation.steps import read_step_fit

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("e2e")]

PER_DOMAIN = 4
BAD_ROWS = {
    "bad-empty": [{"role": "user", "content": "   "}],
    "bad-null": None,
    "bad-role": [{"role": "robot", "content": "hello"}],
    "bad-long": [{"role": "user", "content": "word " * 1500}],
}


def exactly_max_len_messages(max_model_len: int) -> list[dict[str, str]]:
    """A chat whose templated prompt is exactly max_model_len tokens: it passes batchspec's
    length check (it fits) but vLLM rejects it (no room for one output token)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_dir("smollm2-135m-instruct")))

    def length(n: int) -> int:
        chat = [{"role": "user", "content": "hello" + " hello" * n}]
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    n = max_model_len - length(0)
    while length(n) > max_model_len:
        n -= 1
    assert length(n) == max_model_len
    return [{"role": "user", "content": "hello" + " hello" * n}]


def mixed_input(path: Path) -> pa.Table:
    """PER_DOMAIN prompts of every domain, interleaved, plus one row of each bad kind."""
    table = pl.read_parquet(PROMPTS)
    picked = table.group_by("domain", maintain_order=True).head(PER_DOMAIN)
    rows = picked.sort("id").to_dicts()
    BAD_ROWS["bad-engine"] = exactly_max_len_messages(1024)
    for i, (row_id, messages) in enumerate(BAD_ROWS.items()):
        rows.insert(
            5 * i + 3,
            {"id": row_id, "domain": "chat", "prompt": "", "messages": messages, "source": "bad"},
        )
    out = pa.Table.from_pylist(rows, schema=pq.read_schema(PROMPTS).remove_metadata())
    pq.write_table(out, path, row_group_size=10)
    return out


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    source = mixed_input(tmp / "in.parquet")
    # Two domains at a K of their own: the one engine switches K in flight (vllm_live_k).
    job = job_dict(
        tmp / "out",
        input={"path": str(tmp / "in.parquet")},
        speculative={"per_domain": {"translation": 0, "math": 5}},
    )
    path = write_job(tmp / "job.yaml", job)
    # The step costs fitted from this run's steps alone (no prior from the machine's cache).
    env = {**IN_PROCESS_ENGINE, "BATCHSPEC_CACHE": str(tmp / "cache")}
    result = run_cli("run", str(path), "--no-progress", env=env)
    # Every unit committed, some rows error rows: exit 4 (work.completion.Exit.ROWS_FAILED).
    assert result.returncode == 4, result.stderr[-3000:]
    return path, source, pl.read_parquet(tmp / "out" / "parts" / "*.parquet"), result


def test_every_input_row_once(ngram_run) -> None:
    _, source, out, _ = ngram_run
    assert out.height == source.num_rows
    assert out["id"].n_unique() == out.height
    assert sorted(out["id"].to_list()) == sorted(source.column("id").to_pylist())
    assert set(out["source"]) == {"authored-v1", "bad"}


def test_bad_rows_become_error_rows(ngram_run) -> None:
    out = ngram_run[2]
    errors = dict(out.filter(pl.col("error").is_not_null()).select("id", "error").iter_rows())
    assert set(errors) == set(BAD_ROWS)
    assert "no non-empty user turn" in errors["bad-empty"]
    assert "not a non-empty list" in errors["bad-null"]
    assert "'robot'" in errors["bad-role"]
    assert "max_model_len is 1024" in errors["bad-long"]
    assert errors["bad-engine"].startswith("rejected by engine: ")
    assert "1024" in errors["bad-engine"]
    bad = out.filter(pl.col("error").is_not_null())
    assert bad["generated_text"].null_count() == bad.height
    good = out.filter(pl.col("error").is_null())
    assert good["generated_text"].null_count() == 0
    assert (good["num_output_tokens"] > 0).all()
    assert set(good["finish_reason"]) <= {"stop", "length"}
    # The engine that made each row; null where the prompt failed before any engine saw it.
    engines = dict(out.select("id", "engine").iter_rows())
    assert set(good["engine"]) == {"vllm"} and engines["bad-engine"] == "vllm"
    assert {engines[i] for i in BAD_ROWS if i != "bad-engine"} == {None}


def test_acceptance_invariants(ngram_run) -> None:
    """Every row's counts are those of the K it ran at, in the one engine built at the grid's
    top K (8): translation's rows plain decoding (no drafts), math's at 5, the rest at the
    job's K=3 or where the controller took them (K=0 included: rows with no drafts)."""
    good = ngram_run[2].filter(pl.col("error").is_null())
    assert set(good["spec_method"]) <= {"ngram", "none"}
    plain = good.filter(pl.col("spec_method") == "none")
    assert set(plain["num_speculative_tokens"]) <= {0} and plain["num_draft_tokens"].sum() == 0
    assert set(good.filter(pl.col("domain") == "translation")["spec_method"]) == {"none"}
    assert set(good.filter(pl.col("domain") == "math")["num_speculative_tokens"]) == {5}
    spec_rows = good.filter(pl.col("spec_method") == "ngram")
    assert 5 in set(spec_rows["num_speculative_tokens"]) and 0 not in set(
        spec_rows["num_speculative_tokens"]
    )
    assert spec_rows["num_draft_tokens"].sum() > 0
    for r in spec_rows.iter_rows(named=True):
        k = r["num_speculative_tokens"]
        assert 0 <= r["num_accepted_tokens"] <= r["num_draft_tokens"]
        assert sum(r["acceptance_histogram"]) == r["num_spec_steps"]
        assert len(r["acceptance_histogram"]) == k + 1
        assert (
            sum(j * c for j, c in enumerate(r["acceptance_histogram"])) == r["num_accepted_tokens"]
        )
        assert r["num_draft_tokens"] <= k * r["num_spec_steps"]
        if r["num_draft_tokens"]:
            assert r["acceptance_rate"] == pytest.approx(
                r["num_accepted_tokens"] / r["num_draft_tokens"]
            )
            assert r["mean_acceptance_length"] == pytest.approx(
                1 + r["num_accepted_tokens"] / r["num_spec_steps"]
            )
        else:
            assert r["acceptance_rate"] is None


def test_replay_equals_vllms_own_counts(ngram_run) -> None:
    """Every row replayed at every K of the grid; at the K that ran, the replay of vLLM's
    n-gram proposer equals vLLM's own accepted count on every comparable row: a row's K
    column is the K each of its steps ran at, in an engine that changed K between them."""
    assert_replay_exact(ngram_run[0].parent / "out", [0, 1, 2, 3, 5, 8])


def test_units_at_several_k_share_one_engine(ngram_run) -> None:
    """One engine start for units at three K or more (K=0 among them): each row asked vLLM
    for its unit's K (``vllm_live_k``), rows at different K in one batch, nothing rebuilt."""
    out = ngram_run[0].parent / "out"
    (log,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert log["engine_builds"] == 1, log["engines"]
    good = ngram_run[2].filter(pl.col("error").is_null())
    ks = set(good["num_speculative_tokens"])
    assert {0, 5} <= ks and len(ks) >= 3, ks


def test_timing_invariants(ngram_run) -> None:
    good = ngram_run[2].filter(pl.col("error").is_null())
    for r in good.iter_rows(named=True):
        assert 0 <= r["queue_s"] <= r["ttft_s"] <= r["e2e_s"]
        assert r["decode_s"] == pytest.approx(r["e2e_s"] - r["ttft_s"])
        assert r["output_tokens_per_s"] > 0


def test_summary_printed(ngram_run) -> None:
    stdout = ngram_run[3].stdout
    assert "output: " in stdout and "output tokens/s" in stdout
    n = ngram_run[1].num_rows
    assert f"this run: {n} rows ({len(BAD_ROWS)} errors)" in stdout
    # The errors' leading causes, counted (one row each here), and the verdict on the plan.
    causes = next(line for line in stdout.splitlines() if line.startswith("error rows by cause"))
    assert causes.count("1 x ") == 3 and causes.endswith("; 2 more causes"), causes
    assert f"complete with {len(BAD_ROWS)} error rows" in stdout
    for domain in ("chat", "code", "math", "qa", "summarization", "translation"):
        assert f"\n{domain} " in stdout


def test_rerun_is_a_quick_noop(ngram_run) -> None:
    path, _, _, _ = ngram_run
    parts = sorted((path.parent / "out" / "parts").iterdir())
    started = time.monotonic()
    result = run_cli("run", str(path), "--no-progress", env=IN_PROCESS_ENGINE)
    assert result.returncode == 4, result.stderr  # nothing to do; its error rows stay
    assert "nothing to do" in result.stdout
    assert time.monotonic() - started < 60  # no engine start
    assert sorted((path.parent / "out" / "parts").iterdir()) == parts


def test_rerun_with_other_spec_is_refused(ngram_run) -> None:
    path = ngram_run[0]
    result = run_cli("run", str(path), "--set", "sampling.max_tokens=5", env=IN_PROCESS_ENGINE)
    assert result.returncode == 2
    assert "holds a run with a different job spec" in result.stderr


def test_target_as_its_own_draft_accepts_everything(tmp_path: Path) -> None:
    """Also two samples per prompt with log-probabilities (sampling.n, logprobs): rows, their
    logprobs columns and export's order (one engine start serves both). Four prompts in two
    units, 16 tokens each: enough for every check here, and the draft model's steps are slow."""
    job = job_dict(
        tmp_path / "out",
        speculative={
            "method": "draft_model",
            "model": "builtin:smollm2-135m-instruct",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": None,
            "prompt_lookup_max": None,
        },
        output={"unit_rows": 2},
        sampling={"n": 2, "logprobs": 3, "prompt_logprobs": 1, "max_tokens": 16},
    )
    path = write_job(tmp_path / "job.yaml", job)
    result = run_cli("run", str(path), "--limit", "4", "--no-progress", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    out = pl.read_parquet(tmp_path / "out" / "parts" / "*.parquet")
    assert out.height == 8 and out["error"].null_count() == 8
    assert_samples_and_logprobs(out)
    dest = tmp_path / "ds"
    assert run_cli("export", str(tmp_path / "out"), "--to", str(dest)).returncode == 0
    ids = pl.read_parquet(PROMPTS)["id"].head(4).to_list()
    exported = pl.read_parquet(dest / "data" / "*.parquet")
    assert exported["id"].to_list() == [i for i in ids for _ in range(2)]
    assert exported["sample_index"].to_list() == [0, 1] * 4
    assert set(out["spec_method"]) == {"draft_model"}
    assert out["num_draft_tokens"].sum() > 0
    assert (out["num_accepted_tokens"] == out["num_draft_tokens"]).all()
    assert set(out["acceptance_rate"]) == {1.0}


def test_retry_errors_regenerates_only_error_rows(ngram_run, tmp_path: Path) -> None:
    """``--retry-errors`` on a copy of the shared run's output (run on the output itself, it
    rewrote the step fit ``test_k_is_priced_from_vllms_own_steps`` reads): only the error
    rows go through the engine again, every other row untouched."""
    path, source, before, _ = ngram_run
    out = tmp_path / "out"
    shutil.copytree(path.parent / "out", out)
    job = yaml.safe_load(path.read_text())
    job["output"]["dir"] = str(out)
    copy = write_job(tmp_path / "job.yaml", job)
    env = {**IN_PROCESS_ENGINE, "BATCHSPEC_CACHE": str(tmp_path / "cache")}
    result = run_cli("run", str(copy), "--retry-errors", "--no-progress", env=env)
    assert result.returncode == 4, result.stderr[-3000:]  # the error rows fail again
    logs = sorted((out / "runs").glob("*.json"))
    last = json.loads(logs[-1].read_text())
    n_errors = before["error"].is_not_null().sum()
    assert last["rows"] == n_errors  # only the error rows went through the engine again
    after = pl.read_parquet(out / "parts" / "*.parquet")
    assert after.height == source.num_rows and after["id"].n_unique() == after.height
    # Rows that were fine are untouched; the error rows (deterministic here) fail the same way.
    key = ["id", "generated_text", "error"]
    assert after.select(key).sort("id").equals(before.select(key).sort("id"))
    units_with_errors = before.filter(pl.col("error").is_not_null())["unit_id"].n_unique()
    assert len(list((out / "history").iterdir())) == units_with_errors


def assert_samples_and_logprobs(out: pl.DataFrame) -> None:
    """Greedy samples of a prompt are the same text; every generated token has the chosen
    token's log-probability first (the greedy one, so the best) then the top 3; every prompt
    token its own (none for the first)."""
    for _, rows in out.sort("sample_index").group_by("id"):
        assert rows["sample_index"].to_list() == [0, 1]
        assert rows["generated_text"].n_unique() == 1
    for r in out.iter_rows(named=True):
        lps = r["logprobs"]
        assert len(lps) == r["num_output_tokens"]
        for pos in lps:
            values = [e["logprob"] for e in pos]
            assert 3 <= len(pos) <= 4 and values[0] == max(values) and max(values) <= 0
        prompt = r["prompt_logprobs"]
        assert len(prompt) == r["num_prompt_tokens"] and prompt[0] == []
        assert all(1 <= len(pos) <= 2 for pos in prompt[1:])


def test_k_is_priced_from_vllms_own_steps(ngram_run) -> None:
    """The run fitted vLLM's step cost from its steps (``engines.vllm_steps``): the fit
    explains the steps it saw, prices every K of the grid (a decode step costs more with
    more drafts), and ``report`` shows it."""
    out = ngram_run[0].parent / "out"
    found = read_step_fit(OutDir(out))
    assert found is not None
    batch, fit = found
    # Its own steps, and maybe a prior of earlier runs on this machine (vllm_steps).
    assert batch == 8 and fit["steps"] > 0 and fit["steps"] + fit["prior_steps"] >= MIN_STEPS, fit
    # Least squares explains its steps as a whole. Per step K (the largest a row in the step
    # asked for, rows of several K in it) report shows measured against fitted; with another
    # engine test beside this one on 2 cores a group of a few dozen steps was 42 % off.
    groups = fit["by_engine_k"].values()
    steps = sum(g["steps"] for g in groups)
    measured = sum(g["measured_s"] * g["steps"] for g in groups) / steps
    fitted = sum(g["fitted_s"] * g["steps"] for g in groups) / steps
    assert fitted == pytest.approx(measured, rel=0.1), fit
    priced = {int(k): s for k, (s, _) in fit["priced"].items()}
    assert set(priced) == {0, 1, 2, 3, 5, 8} and priced[0] <= priced[3] <= priced[8]
    report = run_cli("report", str(out))
    assert "vLLM step cost, fitted from" in report.stdout, report.stdout
    assert "predicted output tokens/s of the batch at each K" in report.stdout
