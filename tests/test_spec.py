"""Spec parsing: every key validated, one-line errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import job_dict, write_job

from batchspec.errors import UserError
from batchspec.spec import load_spec


def load(tmp_path: Path, overrides: list[str] | None = None, **sections):
    return load_spec(
        write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out", **sections)), overrides or []
    )


def error_of(tmp_path: Path, overrides: list[str] | None = None, **sections) -> str:
    with pytest.raises(UserError) as exc:
        load(tmp_path, overrides, **sections)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_defaults_and_vllm_names(tmp_path: Path) -> None:
    spec = load(tmp_path)
    assert spec.model.max_num_seqs == 8
    assert spec.speculative.method == "ngram"
    assert spec.speculative.k_for("code") == 3
    assert spec.sampling.top_p == 1.0
    assert spec.output_dir == (tmp_path / "out").resolve()


def test_relative_paths_resolve_against_spec_file(tmp_path: Path) -> None:
    job = job_dict(Path("results"))
    job["input"]["path"] = "data/*.parquet"
    path = write_job(tmp_path / "job.yaml", job)
    spec = load_spec(path)
    assert spec.output_dir == tmp_path / "results"
    with pytest.raises(UserError, match=r"input.path: no Parquet file matches 'data/\*.parquet'"):
        spec.input_files()


def test_unknown_key_named(tmp_path: Path) -> None:
    msg = error_of(tmp_path, model={"max_model_length": 10})
    assert "model.max_model_length: unknown key" in msg


def test_wrong_type_named_with_value(tmp_path: Path) -> None:
    msg = error_of(tmp_path, sampling={"max_tokens": "lots"})
    assert "sampling.max_tokens" in msg and "'lots'" in msg


def test_bad_enum(tmp_path: Path) -> None:
    msg = error_of(tmp_path, speculative={"method": "medusa"})
    assert "speculative.method" in msg and "'medusa'" in msg


def test_missing_section(tmp_path: Path) -> None:
    assert "model: required key is missing" in error_of(tmp_path, model=None)


def test_prompt_source_exclusive(tmp_path: Path) -> None:
    msg = error_of(tmp_path, input={"prompt_column": "prompt"})
    assert "input: set exactly one of prompt_column and messages_column" in msg


def test_draft_method_needs_model(tmp_path: Path) -> None:
    msg = error_of(tmp_path, speculative={"method": "draft_model"})
    assert "speculative: method draft_model needs speculative.model" in msg


def test_per_domain_k_range(tmp_path: Path) -> None:
    assert "'math'" in error_of(tmp_path, speculative={"per_domain": {"math": 99}})


def test_per_domain_k_and_off(tmp_path: Path) -> None:
    spec = load(tmp_path, speculative={"per_domain": {"math": 0, "code": 5}})
    assert spec.speculative.k_for("math") == 0
    assert spec.speculative.k_for("code") == 5
    assert spec.speculative.k_for("chat") == 3
    spec = load(tmp_path, speculative={"method": "none"})
    assert spec.speculative.k_for("code") == 0


def test_set_overrides_are_validated(tmp_path: Path) -> None:
    spec = load(tmp_path, ["sampling.max_tokens=7", "speculative.per_domain={qa: 1}"])
    assert spec.sampling.max_tokens == 7
    assert spec.speculative.per_domain == {"qa": 1}
    assert "sampling.max_tokens" in error_of(tmp_path, ["sampling.max_tokens=-1"])
    assert "sampling.nope: unknown key" in error_of(tmp_path, ["sampling.nope=1"])
    assert "expected key.path=value" in error_of(tmp_path, ["sampling.max_tokens"])


def test_bad_yaml_names_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("input:\n  path: [unclosed\nmodel: x\n")
    with pytest.raises(UserError, match=r"job.yaml: invalid YAML at line \d+"):
        load_spec(path)


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="a job spec is a YAML mapping"):
        load_spec(path)


def test_hash_covers_what_is_generated_not_how_fast(tmp_path: Path) -> None:
    a = load(tmp_path).content_hash()
    for same in [
        "output.dir=/elsewhere",
        "speculative.num_speculative_tokens=5",
        "speculative.method=none",
        "model.max_num_seqs=2",
        "execution.heartbeat_s=1",
    ]:
        assert load(tmp_path, [same]).content_hash() == a, same
    for other in [
        "sampling.max_tokens=33",
        "model.dtype=bfloat16",
        "output.unit_rows=9",
        "input.system_prompt=hi",
    ]:
        assert load(tmp_path, [other]).content_hash() != a, other


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("jobs/**/*.yaml")))
def test_every_shipped_job_spec_is_valid(path: Path) -> None:
    spec = load_spec(path)
    assert spec.output.dir and spec.model.model
