"""Every speculative method batchspec accepts, on real vLLM on the CPU (issue 34, V4):
``batchspec verify`` passes (greedy rows identical in float32; sampled rows by the two-sample
test) and fails with a planted broken sampler (every draft accepted, ``engines.planted``).

- ``draft_model`` with a real smaller draft, ``builtin:smollm2-135m-draft`` (``models_cut``);
- ``eagle3`` with a head from ``batchspec distill`` (speculators format), and ``eagle`` with
  the same head refused by ``validate`` (vLLM 0.32 reads a speculators head as EAGLE-3 only);
- ``suffix`` when Arctic Inference is installed (``scripts/setup_suffix.sh``);
- n-gram is ``tests/test_verify.py``; ``mtp`` needs MTP layers, refused by ``validate``
  (``tests/test_bad_inputs.py``).

The engine tests start four to six engines each: they run with ``--full``
(docs/vllm-methods.md has the table they back). The checks ``validate`` makes run always.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import IN_PROCESS_ENGINE, job_dict, run_cli, small_job, write_job
from test_cli_errors import assert_user_error, cli
from test_verify import near_tie_job

from batchspec.engines.planted import ACCEPT_ALL_ENV

BIASED = IN_PROCESS_ENGINE | {ACCEPT_ALL_ENV: "1"}
DRAFT = {"method": "draft_model", "model": "builtin:smollm2-135m-draft"}
SUFFIX = {"method": "suffix"}
HAS_ARCTIC = importlib.util.find_spec("arctic_inference") is not None


def report(out: Path) -> dict:
    (path,) = sorted((out / "verify").glob("report-*.json"))
    return json.loads(path.read_text())


def verify(job: Path, out: Path, *args: str, planted: bool = False) -> dict:
    """``batchspec verify`` into ``out``: its report, checked for the exit code a pass (or,
    planted, a failure) gives."""
    env = BIASED if planted else IN_PROCESS_ENGINE
    result = run_cli("verify", str(job), "--output", str(out), *args, env=env)
    want = 1 if planted else 0
    assert result.returncode == want, result.stdout[-2000:] + result.stderr[-3000:]
    assert ("verify: FAIL" if planted else "verify: pass") in result.stdout
    return report(out)


def greedy_pass_and_planted_fail(job: Path, tmp: Path) -> None:
    """Float32 greedy rows identical to plain decoding with some draft accepted; with every
    draft accepted, rows diverge and each divergence is a failure."""
    (check,) = verify(job, tmp / "ok", "--rows", "6")["checks"]
    assert check["dtype"] == "float32" and check["rows"] == check["identical"] == 6
    assert report(tmp / "ok")["drafts_accepted"] > 0
    (check,) = verify(job, tmp / "bad", "--rows", "6", planted=True)["checks"]
    assert check["failures"] > 0 and check["near_ties"] == 0


def sampled_pass_and_planted_fail(tmp: Path, speculative: dict, tokens: int = 2) -> None:
    """``test_verify.near_tie_job`` with this method: passes, and fails with every draft
    accepted. ``tokens``: the positions compared (a weak head's first draft may never be
    accepted)."""
    path = near_tie_job(tmp, "sampled.yaml", speculative)
    args = ["--rows", "1", "--samples", "150", "--tokens", str(tokens)]
    (check,) = verify(path, tmp / "sampled-ok", *args)["checks"]
    assert check["check"] == "sampled" and check["rejected"] == 0
    (check,) = verify(path, tmp / "sampled-bad", *args, planted=True)["checks"]
    assert check["check"] == "sampled" and check["rejected"] > 0


@pytest.mark.engine
@pytest.mark.parametrize(
    "speculative",
    [
        pytest.param(DRAFT, id="draft_model"),
        pytest.param(
            SUFFIX,
            id="suffix",
            marks=pytest.mark.skipif(
                not HAS_ARCTIC, reason="Arctic Inference: bash scripts/setup_suffix.sh"
            ),
        ),
    ],
)
def test_method_greedy_and_sampled(tmp_path: Path, full: bool, speculative: dict) -> None:
    """A draft model (a smaller one) and suffix decoding: ``verify`` passes greedy and
    sampled, and fails each with every draft accepted."""
    if not full:
        pytest.skip("six engine starts: runs with --full")
    job = small_job(tmp_path, 1, speculative=speculative, sampling={"max_tokens": 32})
    greedy_pass_and_planted_fail(job, tmp_path)
    sampled_pass_and_planted_fail(tmp_path, speculative)


@pytest.mark.engine
def test_eagle3_with_a_distilled_head(tmp_path: Path, full: bool) -> None:
    """A head distilled from 24 rows of the job's own outputs (the rows verify then checks
    among them: acceptance, not generality, is what a test of losslessness needs)."""
    if not full:
        pytest.skip("a run, a distill and six engine starts: runs with --full")
    job = small_job(tmp_path, 4, sampling={"max_tokens": 32})
    ran = run_cli("run", str(job), env=IN_PROCESS_ENGINE)
    assert ran.returncode == 0, ran.stderr[-3000:]
    args = ["--holdout", "0", "--epochs", "3", "--vocab", "2048"]
    distilled = run_cli("distill", str(job), *args)
    assert distilled.returncode == 0, distilled.stderr[-3000:]
    head = {"method": "eagle3", "model": str(tmp_path / "out" / "drafts" / "eagle3")}
    job = small_job(tmp_path, 1, speculative=head, sampling={"max_tokens": 32})
    greedy_pass_and_planted_fail(job, tmp_path)
    # At 2 tokens this head's one draft step accepted 0 of 450 drafts (inconclusive).
    sampled_pass_and_planted_fail(tmp_path, head, tokens=4)


def test_validate_refuses_suffix_without_arctic_inference(tmp_path: Path, monkeypatch) -> None:
    """vLLM would refuse it only once its engine starts, a minute into the run."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "arctic_inference" else real(name, *a),
    )
    job = write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out", speculative=SUFFIX))
    assert_user_error(
        cli("validate", str(job)),
        "speculative.method: suffix needs Arctic Inference, which is not installed here",
    )


def test_validate_refuses_an_eagle3_head_given_as_eagle(tmp_path: Path) -> None:
    """vLLM 0.32 runs an EAGLE-3 head under ``method: eagle`` without a word, feeding it the
    last layer's hidden state instead of its three feature layers (8 of 534 drafts accepted
    where ``eagle3`` accepted 34 of 456, docs/vllm-methods.md): refused before it starts."""
    head = tmp_path / "head"
    head.mkdir()
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}
    (head / "config.json").write_text(json.dumps(config))
    spec = {"method": "eagle", "model": str(head)}
    job = write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out", speculative=spec))
    assert_user_error(
        cli("validate", str(job)), "speculative.model: head is an EAGLE-3 head: use method eagle3"
    )


def test_an_eagle3_heads_kv_cache_is_sized_from_its_layer(tmp_path: Path) -> None:
    """A speculators head states its layer under ``transformer_layer_config``: read there, the
    CPU engine's KV cache is sized for the job (before, it fell back to 30 % of host memory,
    ~7 GB here, allocated and touched at every EAGLE-3 engine's start)."""
    from batchspec.engines.vllm_args import cpu_kv_cache_bytes
    from batchspec.models import resolve_model
    from batchspec.spec import JobSpec

    head = tmp_path / "head"
    head.mkdir()
    layer = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
             "num_hidden_layers": 1, "max_position_embeddings": 8192}  # fmt: skip
    config = {"speculators_model_type": "eagle3", "transformer_layer_config": layer}
    (head / "config.json").write_text(json.dumps(config))
    spec = JobSpec.model_validate(job_dict(tmp_path / "out"))
    target = resolve_model(spec.model.model, "model.model", auto_prepare=True)
    alone = cpu_kv_cache_bytes(spec, [target], 3)
    both = cpu_kv_cache_bytes(spec, [target, head], 3)
    assert alone is not None and both is not None
    assert both - alone == spec.model.max_num_seqs * (1024 + 3) * 2 * 3 * 64 * 4 * 1.25 // 1
