"""Bad input: one line naming the field or file, exit code 2, no traceback (no engine starts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import PROMPTS, run_cli

from batchspec.models import embedded_dir


def assert_user_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("batchspec: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_yaml(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("input: {path: x\nmodel: [\n")
    assert_user_error(run_cli("run", str(job)), "job.yaml", "invalid YAML at line")


def test_missing_spec_file(tmp_path: Path) -> None:
    assert_user_error(run_cli("validate", str(tmp_path / "nope.yaml")), "nope.yaml", "cannot read")


@pytest.mark.parametrize(
    ("sections", "needles"),
    [
        ({"model": {"max_model_length": 5}}, ["model.max_model_length: unknown key"]),
        ({"sampling": {"temperature": "hot"}}, ["sampling.temperature", "'hot'"]),
        ({"input": {"path": "missing/*.parquet"}}, ["input.path", "missing/*.parquet"]),
        (
            {"input": {"messages_column": "msgs"}},
            ["input.messages_column 'msgs'", "prompts.parquet"],
        ),
        ({"input": {"domain_column": "topic"}}, ["input.domain_column 'topic'"]),
        ({"input": {"passthrough_columns": ["error"]}}, ["input.passthrough_columns", "'error'"]),
        (
            {"model": {"model": "/no/such/model"}},
            ["model.model", "/no/such/model", "does not exist"],
        ),
        ({"model": {"model": "builtin:gpt-17"}}, ["model.model", "unknown embedded model"]),
        (
            {"model": {"engine_kwargs": {"disable_log_stats": True}}},
            ["model.engine_kwargs", "'disable_log_stats' is set by batchspec"],
        ),
        (
            {"speculative": {"method": "ngram", "extra": {"num_speculative_tokens": 9}}},
            ["speculative.extra", "use speculative.num_speculative_tokens"],
        ),
        (
            {"speculative": {"method": "eagle", "model": "x", "tree": {}}},
            ["speculative", "ngram or draft_model", "engine: vllm, no tree key"],
        ),
        (
            {"speculative": {"method": "suffix", "engine": "auto"}},
            ["speculative", "engine auto", "method suffix runs on one only"],
        ),
        (
            {"speculative": {"method": "draft_model", "engine": "auto", "tree": {}}},
            ["speculative", "engine auto needs a draft model both engines load"],
        ),
        ({"speculative": {"engine": "gpu"}}, ["speculative.engine", "'vllm', 'tree' or 'auto'"]),
        (
            {"speculative": {"method": "draft_model", "tree": {}}},
            ["speculative.model", "or tree.draft_layers"],
        ),
        (
            {"speculative": {"method": "ngram", "tree": {"draft_layers": [0, 1]}}},
            ["draft_layers needs method draft_model"],
        ),
        (
            {"speculative": {"method": "draft_model", "tree": {"draft_layers": [0, 30]}}},
            ["speculative.tree.draft_layers", "layer 30 does not exist", "0..29"],
        ),
    ],
)
def test_spec_errors(job_file, sections, needles) -> None:
    assert_user_error(run_cli("run", str(job_file(**sections))), *needles)


def test_model_dir_without_config(job_file, tmp_path: Path) -> None:
    empty = tmp_path / "empty_model"
    empty.mkdir()
    assert_user_error(
        run_cli("validate", str(job_file(model={"model": str(empty)}))), "has no config.json"
    )


def test_set_override_validated(job_file) -> None:
    assert_user_error(
        run_cli("run", str(job_file()), "--set", "speculative.num_speculative_tokens=many"),
        "speculative.num_speculative_tokens",
    )


def test_wrong_prompt_column_type(job_file) -> None:
    assert_user_error(
        run_cli(
            "validate", str(job_file(input={"messages_column": None, "prompt_column": "messages"}))
        ),
        "input.prompt_column 'messages' must hold strings",
    )


def _draft_with_swapped_tokens(tmp_path: Path) -> Path:
    """The embedded model with two vocabulary entries swapped in its tokenizer."""
    src = embedded_dir("smollm2-135m-instruct")
    draft = tmp_path / "draft"
    draft.mkdir()
    for f in src.iterdir():
        if f.name == "model.safetensors":
            (draft / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy(f, draft / f.name)
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a = next(t for t, i in vocab.items() if i == 1000)
    b = next(t for t, i in vocab.items() if i == 1001)
    vocab[a], vocab[b] = 1001, 1000
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    return draft


def test_draft_tokenizer_mismatch_names_token(job_file, tmp_path: Path) -> None:
    draft = _draft_with_swapped_tokens(tmp_path)
    job = job_file(speculative={"method": "draft_model", "model": str(draft)})
    assert_user_error(
        run_cli("validate", str(job)),
        "speculative.model: tokenizer differs",
        "first at token id 1000",
    )


def test_validate_ok(job_file) -> None:
    job = job_file(speculative={"method": "draft_model", "model": "builtin:smollm2-135m-instruct"})
    result = run_cli("validate", str(job))
    assert result.returncode == 0, result.stderr
    assert "input: 1 file(s), 360 rows" in result.stdout
    assert (
        "domains: chat=60, code=60, math=60, qa=60, summarization=60, translation=60"
        in result.stdout
    )
    assert "tokenizer identical" in result.stdout
    assert str(PROMPTS.name) not in result.stderr
