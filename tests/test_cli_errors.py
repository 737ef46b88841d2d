"""Bad input: one line naming the field or file, exit code 2, no traceback (no engine starts)."""

from __future__ import annotations

import json
import shutil
import subprocess
import traceback
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import PROMPTS, run_cli
from test_route import auto_job, routed_tuning

from batchspec.cli import main
from batchspec.io.checks import preflight
from batchspec.io.layout import OutDir
from batchspec.io.manifest import claim_output_dir, make_manifest
from batchspec.models import embedded_dir
from batchspec.spec.file import load_spec


def cli(*args: str) -> subprocess.CompletedProcess:
    """``batchspec ARGS`` in this process (click's runner), for commands that cannot start an
    engine: a subprocess's ~1 s start saved. An exception that escaped the command comes back
    as a traceback on stderr, as a subprocess would print it."""
    result = CliRunner().invoke(main, list(args))
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback: " + "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, stderr)


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
            ["speculative", "ngram, suffix, draft_model or eagle3", "engine: vllm, no tree key"],
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
            {"speculative": {"method": "ngram", "tree": {"ngram_first": True}}},
            ["ngram_first needs method draft_model or eagle3"],
        ),
        (
            {"speculative": {"method": "draft_model", "tree": {"draft_layers": [0, 30]}}},
            ["speculative.tree.draft_layers", "layer 30 does not exist", "0..29"],
        ),
    ],
)
def test_spec_errors(job_file, sections, needles) -> None:
    assert_user_error(run_cli("run", str(job_file(**sections))), *needles)


@pytest.mark.parametrize(
    ("sections", "needles"),
    [
        (
            {"speculative": {"engine": "vllm", "tree": {"branching": [2, 2]}}},
            ["speculative.tree is set but speculative.engine is vllm"],
        ),
        ({"sampling": {"max_tokens": True}}, ["sampling.max_tokens", "valid integer"]),
        ({"sampling": {"temperature": True}}, ["sampling.temperature", "valid number"]),
        ({"model": {"enforce_eager": 1}}, ["model.enforce_eager", "valid boolean"]),
        ({"model": {"seed": -1}}, ["model.seed", "greater than or equal to 0"]),
        ({"sampling": {"stop": ["END", ""]}}, ["sampling.stop", "empty stop string"]),
        (
            {"input": {"passthrough_columns": ["source", "source"]}},
            ["input.passthrough_columns", "'source' is listed twice"],
        ),
    ],
)
def test_spec_values_refused_before_anything_runs(job_file, sections, needles) -> None:
    """Values the spec took before (a tree vLLM dropped, booleans read as numbers) or that
    vLLM refused only once its engine was up (a negative seed, an empty stop string)."""
    assert_user_error(cli("validate", str(job_file(**sections))), *needles)


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


def test_temperature_yes_is_refused_as_written_in_yaml(tmp_path: Path) -> None:
    """YAML's ``yes`` is a boolean: it must not become temperature 1.0."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"input: {{path: {PROMPTS}, messages_column: messages}}\n"
        f"output: {{dir: {tmp_path / 'out'}}}\n"
        "model: {model: builtin:smollm2-135m-instruct}\n"
        "sampling: {temperature: yes, max_tokens: 8}\n"
    )
    assert_user_error(cli("validate", str(job)), "sampling.temperature", "(got True)")


@pytest.mark.parametrize(
    ("command", "where", "needles"),
    [
        ("run", "file", ["is a file, not a directory"]),
        ("validate", "file", ["is a file, not a directory"]),
        ("validate", "file/sub", ["lies under", "which is a file"]),
        ("run", "/proc/batchspec-out", ["cannot be created in /proc"]),
        ("validate", "/sys/batchspec-out", ["cannot be created in /sys"]),
    ],
)
def test_output_dir_that_cannot_be_written(job_file, tmp_path: Path, command, where, needles):
    """Refused in one line by validate and by run (which wrote a traceback before), and run
    writes nothing (the file in the way stays as it was). Not writable even as root: /proc
    and /sys take no new directories."""
    (tmp_path / "file").write_text("not a directory\n")
    out = tmp_path / where if not where.startswith("/") else Path(where)
    job = str(job_file(output={"dir": str(out), "unit_rows": 8}))
    result = run_cli(command, job) if command == "run" else cli(command, job)
    assert_user_error(result, "output.dir", str(out), *needles)
    assert (tmp_path / "file").read_text() == "not a directory\n"
    assert not out.is_dir()


def test_messages_of_other_field_names_are_refused_up_front(job_file, tmp_path: Path) -> None:
    path = tmp_path / "speaker.parquet"
    chats = [[{"speaker": "user", "text": f"say {i}"}] for i in range(4)]
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "messages": chats}), path)
    spec = {"path": str(path), "domain_column": None, "passthrough_columns": []}
    job = str(job_file(input=spec))
    for result in (cli("validate", job), run_cli("run", job)):
        assert_user_error(
            result,
            "speaker.parquet",
            "input.messages_column 'messages'",
            "{role: string, content: string}",
            "speaker: string",
        )
    assert not (tmp_path / "out").exists()


def test_set_errors_blame_the_set_not_the_file(job_file) -> None:
    result = cli("validate", str(job_file()), "--set", "foo.bar=1")
    assert_user_error(result, "--set foo.bar=1: foo: unknown key")
    assert "job.yaml" not in result.stderr


def test_per_domain_of_no_input_domain_warns_in_validate_and_run(job_file, tmp_path) -> None:
    job = job_file(speculative={"per_domain": {"zzz": 2, "math": 0}})
    result = run_cli("validate", str(job))
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("batchspec: warning: speculative.per_domain: zzz named")
    assert "the domains of the input are chat, code, math, qa, summarization, translation" in line
    # An auto job without a tuning file stops right after the checks: no engine starts.
    auto = {"engine": "auto", "per_domain": {"zzz": 2}}
    result = run_cli("run", str(job_file(speculative=auto)), "--limit", "3")
    warning, error = result.stderr.splitlines()
    assert warning.startswith("batchspec: warning: speculative.per_domain: zzz named")
    assert "the domains of the first 3 rows are chat;" in warning
    assert error.startswith("batchspec: error: ")
    assert result.returncode == 2


def bind_output_dir(job: Path, limit: int | None) -> OutDir:
    """The output directory bound as ``run --limit LIMIT`` binds it, without an engine."""
    spec = load_spec(job)
    pre = preflight(spec, limit)
    out = OutDir(spec.output_dir)
    claim_output_dir(out, make_manifest(spec, pre.files, limit, pre.units))
    return out


@pytest.mark.parametrize(("bound", "given", "said"), [
    (2, [], "--limit 2 (this run: no --limit)"),
    (None, ["--limit", "5"], "no --limit (this run: --limit 5)"),
])  # fmt: skip
def test_a_directory_of_another_limit_is_refused_by_validate_and_run(
    job_file, bound, given, said
) -> None:
    job = job_file()
    out = bind_output_dir(job, bound)
    before = sorted(p.name for p in out.root.iterdir())
    for command in ("validate", "run"):
        assert_user_error(run_cli(command, str(job), *given), "refusing to mix them", said)
    assert sorted(p.name for p in out.root.iterdir()) == before


def test_tune_batch_sizes_must_be_positive(job_file) -> None:
    for batches in ("8,0", "8,x"):  # a subprocess: a tune that got past it would start engines
        assert_user_error(run_cli("tune", str(job_file()), "--batch", batches), "--batch")


def test_validate_checks_the_tuning_file_as_run_does(tmp_path: Path) -> None:
    """One check for both (``work.prepare.check_run``): an auto job without a route, or a
    tuning file of another job, is refused by validate as by run."""
    job = auto_job(tmp_path)
    assert_user_error(cli("validate", str(job)), "speculative.engine: auto", "batchspec tune")
    routed_tuning(job, {"vllm": 8, "tree": 8}, {8: "tree"})
    result = cli("validate", str(job))
    assert result.returncode == 0, result.stderr
    assert "now tree, as batchspec tune measured at batch 8" in result.stdout
    other = cli("validate", str(job), "--set", "sampling.temperature=0.5")
    assert_user_error(other, "tuning.json: measured with", "run batchspec tune again")
    # An adaptive job on vLLM reads the tuning file too: one of another job is refused.
    chains = str(job), "--set", "speculative.engine=vllm", "--set", "speculative.tree=null"
    routed_tuning(Path(chains[0]), {"vllm": 8}, {})
    assert cli("validate", *chains).returncode == 0
    other = cli("validate", *chains, "--set", "sampling.temperature=0.5")
    assert_user_error(other, "tuning.json: measured with", "run batchspec tune again")
