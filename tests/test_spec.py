"""Spec parsing: every key validated, one-line errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, job_dict, write_job
from pydantic import BaseModel

from batchspec.errors import UserError
from batchspec.spec import OUTPUT_NEUTRAL, JobSpec
from batchspec.spec.docs import reference, written_block
from batchspec.spec.file import load_spec
from batchspec.units import SpecStats


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


# One change per spec key, to a valid value other than the test job's. A key missing here fails
# the test below, so every new key gets its hash behaviour decided and checked (vLLM's rule).
CHANGES: dict[str, list[str]] = {
    "input.path": ["input.path=other.parquet"],
    "input.id_column": ["input.id_column=rid"],
    "input.prompt_column": ["input.prompt_column=prompt", "input.messages_column=null"],
    "input.messages_column": ["input.messages_column=msgs"],
    "input.apply_chat_template": ["input.apply_chat_template=false"],
    "input.system_prompt": ["input.system_prompt=hi"],
    "input.domain_column": ["input.domain_column=topic"],
    "input.passthrough_columns": ["input.passthrough_columns=[]"],
    "input.format": ["input.format=parquet"],
    "input.split": ["input.format=hf", "input.split=test"],
    "output.dir": ["output.dir=/elsewhere"],
    "output.unit_rows": ["output.unit_rows=9"],
    "model.model": ["model.model=/other/model"],
    "model.tokenizer": ["model.tokenizer=/other/tokenizer"],
    "model.dtype": ["model.dtype=bfloat16"],
    "model.max_model_len": ["model.max_model_len=512"],
    "model.tensor_parallel_size": ["model.tensor_parallel_size=2"],
    "model.max_num_seqs": ["model.max_num_seqs=2"],
    "model.gpu_memory_utilization": ["model.gpu_memory_utilization=0.5"],
    "model.enforce_eager": ["model.enforce_eager=false"],
    "model.seed": ["model.seed=1"],
    "model.engine_kwargs": ["model.engine_kwargs={quantization: fp8}"],
    "speculative.method": ["speculative.method=none"],
    "speculative.model": ["speculative.model=/draft"],
    "speculative.num_speculative_tokens": ["speculative.num_speculative_tokens=5"],
    "speculative.prompt_lookup_min": ["speculative.prompt_lookup_min=1"],
    "speculative.prompt_lookup_max": ["speculative.prompt_lookup_max=6"],
    "speculative.draft_tensor_parallel_size": ["speculative.draft_tensor_parallel_size=2"],
    "speculative.per_domain": ["speculative.per_domain={math: 0}"],
    "speculative.k_by_batch_size": [
        "speculative.adaptive=false",
        "speculative.k_by_batch_size=[[1, 4, 3], [5, 16, 0]]",
    ],
    "speculative.adaptive": ["speculative.adaptive=false"],
    "speculative.k_grid": ["speculative.k_grid=[0, 3]"],
    "speculative.explore": ["speculative.explore=0.5"],
    "speculative.tree": ["speculative.tree={branching: [2, 2]}"],
    "speculative.suffix": [
        "speculative.engine=tree",
        "speculative.method=suffix",
        "speculative.suffix={max_tokens: 4096}",
    ],
    "speculative.drafters": ["speculative.engine=tree", "speculative.drafters=[ngram, suffix]"],
    "speculative.engine": ["speculative.engine=tree"],
    "speculative.extra": ["speculative.extra={disable_padded_drafter_batch: true}"],
    "sampling.temperature": ["sampling.temperature=0.7"],
    "sampling.top_p": ["sampling.top_p=0.9"],
    "sampling.top_k": ["sampling.top_k=5"],
    "sampling.max_tokens": ["sampling.max_tokens=33"],
    "sampling.stop": ["sampling.stop=[END]"],
    "sampling.seed": ["sampling.seed=7"],
    "sampling.n": ["sampling.n=4"],
    "sampling.columns": ["sampling.columns={max_tokens: budget}"],
    "sampling.min_tokens": ["sampling.min_tokens=4"],
    "sampling.repetition_penalty": ["sampling.repetition_penalty=1.2"],
    "sampling.frequency_penalty": ["sampling.frequency_penalty=0.5"],
    "sampling.presence_penalty": ["sampling.presence_penalty=0.5"],
    "sampling.logprobs": ["sampling.logprobs=1"],
    "sampling.prompt_logprobs": ["sampling.prompt_logprobs=1"],
    "sampling.json_schema": ["sampling.json_schema={type: object}"],
    "sampling.regex": ["sampling.regex='[a-z]+'"],
    "sampling.choice": ["sampling.choice=[red, blue]"],
    "execution.lease_timeout_s": ["execution.lease_timeout_s=100"],
    "execution.heartbeat_s": ["execution.heartbeat_s=1"],
    "execution.max_unit_attempts": ["execution.max_unit_attempts=5"],
    "execution.engine_stall_s": ["execution.engine_stall_s=60"],
    "execution.linger_s": ["execution.linger_s=0"],
    "execution.shutdown_grace_s": ["execution.shutdown_grace_s=1"],
    "name": ["name=other"],
}


def spec_keys(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[str]:
    """Every key a spec can set, dotted, sections expanded."""
    keys = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        typ = info.annotation
        if isinstance(typ, type) and issubclass(typ, BaseModel):
            keys += spec_keys(typ, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_every_key_is_hashed_unless_declared_output_neutral(tmp_path: Path) -> None:
    keys = spec_keys()
    assert sorted(CHANGES) == sorted(keys), "decide the hash behaviour of every new spec key"
    sections = {k.split(".")[0] for k in keys}
    assert set(keys) | sections >= OUTPUT_NEUTRAL, "OUTPUT_NEUTRAL names a key that is gone"
    base = load(tmp_path).content_hash()
    for key, overrides in CHANGES.items():
        neutral = key in OUTPUT_NEUTRAL or key.split(".")[0] in OUTPUT_NEUTRAL
        changed = load(tmp_path, overrides).content_hash() != base
        assert changed != neutral, f"{key}: {'in' if changed else 'not in'} the hash"


def test_spec_reference_page_is_generated_from_the_spec() -> None:
    page = (Path(__file__).parents[1] / "docs" / "spec.md").read_text()
    assert written_block(page) == reference(), (
        "docs/spec.md is stale: python -m batchspec.spec.docs --write docs/spec.md"
    )


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("jobs/**/*.yaml")))
def test_every_shipped_job_spec_is_valid(path: Path) -> None:
    spec = load_spec(path)
    assert spec.output.dir and spec.model.model


def test_a_key_given_twice_is_refused_at_any_depth(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys silently; a spec refuses them, naming the key
    and both lines, also in a flow mapping and a ``--set`` value. A merge (``<<``) may still
    override what it brings in."""
    from batchspec.spec.file import load_yaml

    with pytest.raises(UserError, match=r"^s: a\.b: given twice \(both on line 1\)"):
        load_yaml("a: {b: 1, b: 2}\n", "s")
    with pytest.raises(UserError, match=r"^s: a\.1\.c: given twice \(lines 3 and 4\)"):
        load_yaml("a:\n  - x\n  - c: 1\n    c: 2\n", "s")
    assert load_yaml("base: &b {x: 1}\nuse: {<<: *b, x: 2}\n", "s")["use"] == {"x": 2}
    assert error_of(tmp_path, ["model.engine_kwargs={k: 1, k: 2}"]).startswith(
        "--set model.engine_kwargs={k: 1, k: 2}: model.engine_kwargs.k: given twice"
    )


def test_a_batch_size_schedule_is_vllms_in_one_engine_at_its_largest_k(tmp_path: Path) -> None:
    """``speculative.k_by_batch_size`` reaches vLLM as ``num_speculative_tokens_per_batch_size``
    and every domain's K is the schedule's largest (the engine's); no single K's replay is
    compared with the engine's counts, since a row's steps ran at several."""
    from batchspec.engines.vllm_args import speculative_config
    from batchspec.work.feeding import Replays

    sets = ["speculative.adaptive=false", "speculative.k_by_batch_size=[[5, 16, 0], [1, 4, 5]]"]
    spec = load_spec(ROOT / "jobs" / "synth_data.yaml", sets)
    s = spec.speculative
    assert s.k_by_batch_size == [[1, 4, 5], [5, 16, 0]]  # sorted
    assert s.fixed_k("chat") == s.fixed_k(None) == s.k_for("code") == 5
    cfg = speculative_config(spec, 5)
    assert cfg is not None and cfg["num_speculative_tokens"] == 5
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 4, 5], [5, 16, 0]]
    replays = Replays(spec)
    replays._check(
        {5: 7}, SpecStats(steps=4, drafted=10, accepted=3, histogram=(1, 1, 1, 1, 0, 0)), 5, set()
    )
    assert replays.checked == 0
