"""Bad input refused by ``validate`` in one line naming the key, exit 2, before anything is
written or any engine starts: a table of the default job with one thing wrong (issue 33).

Each case is the shipped default job (``jobs/synth_data.yaml``, made small by ``job_dict``)
with one change, run through ``batchspec validate`` in this process (``cli``): what ``run``
checks first too (``work.prepare.check_run``), so a case that passes here cannot fail a minute
into a run instead. The output directory must not exist afterwards.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PROMPTS, ROOT, job_dict
from test_cli_errors import assert_user_error, cli

from batchspec import models
from batchspec.io.model_checks import numa_nodes, vllm_cpu_build

Edit = Callable[[Path, dict[str, Any]], str]
"""Writes a changed job into a folder, given the default job as a dict; returns its text."""


def sections(**changes: dict[str, Any]) -> Edit:
    """The default job with these keys changed, section by section (``None`` drops a key)."""

    def edit(_tmp: Path, job: dict[str, Any]) -> str:
        for name, values in changes.items():
            if isinstance(values, dict):
                job.setdefault(name, {}).update(values)
                job[name] = {k: v for k, v in job[name].items() if v is not None}
            else:
                job[name] = values
        return yaml.safe_dump(job, sort_keys=False)

    return edit


def text(change: Callable[[str], str]) -> Edit:
    """The default job's YAML text, changed as text (what a dict cannot hold: a key twice)."""
    return lambda _tmp, job: change(yaml.safe_dump(job, sort_keys=False))


def input_copy_in(folder: str, out: str, glob: str | None = None) -> Edit:
    """The shipped input copied into ``tmp/folder``, read from there (or by ``glob``), with
    the output directory at ``tmp/out``."""

    def edit(tmp: Path, job: dict[str, Any]) -> str:
        (tmp / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(PROMPTS, tmp / folder / "prompts.parquet")
        job["input"]["path"] = str(tmp / (glob or f"{folder}/prompts.parquet"))
        job["output"]["dir"] = str(tmp / out)
        return yaml.safe_dump(job, sort_keys=False)

    return edit


CASES: list[Any] = [
    pytest.param(text(lambda t: t + "sampling:\n  temperature: 0.5\n"),
                 ["job.yaml: sampling: given twice (lines", "would silently replace"],
                 id="two sampling sections"),
    pytest.param(text(lambda t: t.replace("model:\n", "model:\n  dtype: float16\n", 1)),
                 ["job.yaml: model.dtype: given twice"], id="a key twice in a section"),
    pytest.param(sections(sampling={"regex": "([a-z"}),
                 ["sampling.regex: not a valid regular expression (unterminated"], id="regex"),
    pytest.param(sections(sampling={"choice": []}), ["sampling.choice: an empty list"],
                 id="no choice"),
    pytest.param(sections(model={"max_model_len": 1_000_000_000}),
                 ["model.max_model_len: 1000000000 is more than the 8192 positions of "
                  "smollm2-135m-instruct (max_position_embeddings"], id="context too long"),
    pytest.param(sections(model={"max_model_len": 2048}, sampling={"max_tokens": 100_000}),
                 ["sampling.max_tokens: 100000 leaves no room for a prompt in "
                  "model.max_model_len 2048"], id="max_tokens over the context"),
    pytest.param(sections(model={"max_model_len": 20}),
                 ["sampling.max_tokens: 32 leaves no room", "model.max_model_len 20"],
                 id="context too short"),
    pytest.param(sections(model={"max_model_len": None}, sampling={"max_tokens": 9000}),
                 ["sampling.max_tokens: 9000 leaves no room", "the 8192 positions"],
                 id="max_tokens over the model's context"),
    pytest.param(sections(sampling={"temperature": float("inf")}),
                 ["sampling.temperature: Input should be a finite number"], id="inf"),
    pytest.param(sections(sampling={"top_p": float("nan")}),
                 ["sampling.top_p: Input should be a finite number"], id="nan"),
    pytest.param(sections(execution={"lease_timeout_s": float("inf")}),
                 ["execution.lease_timeout_s: Input should be a finite number"],
                 id="infinite lease"),
    pytest.param(sections(sampling={"seed": -1}), ["sampling.seed", "greater than or equal to 0"],
                 id="negative seed"),
    pytest.param(sections(sampling={"seed": 2**70}), ["sampling.seed", "less than or equal to"],
                 id="seed over 63 bits"),
    pytest.param(sections(speculative={"method": "mtp"}),
                 ["speculative.method: mtp needs a model with MTP layers",
                  "smollm2-135m-instruct declares none"], id="mtp without MTP layers"),
    pytest.param(sections(speculative={"method": "eagle3",
                                       "model": "builtin:smollm2-135m-instruct"}),
                 ["speculative.model: smollm2-135m-instruct is a full model (LlamaForCausalLM, "
                  "30 layers), not an eagle3 head"], id="the target as its own head"),
    pytest.param(sections(model={"engine_kwargs": {"not_a_vllm_kwarg": 1}}),
                 ["model.engine_kwargs: 'not_a_vllm_kwarg' is not a vllm.LLM keyword"],
                 id="unknown engine keyword"),
    pytest.param(sections(model={"engine_kwargs": {"max_num_batched_token": 64}}),
                 ["did you mean 'max_num_batched_tokens'?"], id="misspelt engine keyword"),
    pytest.param(sections(model={"engine_kwargs": {"quantization": "bogus"}}),
                 ["model.engine_kwargs: quantization 'bogus' is not one of vLLM's"],
                 id="unknown quantization"),
    pytest.param(sections(model={"tensor_parallel_size": 2}),
                 ["model.tensor_parallel_size: 2 does not divide the 9 attention heads"],
                 id="heads not divisible"),
    pytest.param(sections(model={"tensor_parallel_size": 2}, speculative={"engine": "tree"}),
                 ["model.tensor_parallel_size > 1 needs vLLM; the tree engine runs on one"],
                 id="tree engine in parallel"),
    pytest.param(sections(model={"max_num_seqs": 1_000_000_000}),
                 ["model.max_num_seqs: Input should be less than or equal to 16384"],
                 id="huge batch"),
    pytest.param(sections(name=""), ["job.yaml: name: letters, digits"], id="empty name"),
    pytest.param(sections(speculative={"adaptive": False, "k_by_batch_size": [[2, 8, 3]]}),
                 ["speculative.k_by_batch_size: k_by_batch_size: the first range must start at "
                  "batch size 1"], id="schedule from batch 2"),
    pytest.param(sections(speculative={"adaptive": False,
                                       "k_by_batch_size": [[1, 4, 3], [4, 8, 0]]}),
                 ["k_by_batch_size: [4, 8, 0] overlaps [1, 4, 3]"], id="schedule overlaps"),
    pytest.param(sections(speculative={"k_by_batch_size": [[1, 8, 3]]}),
                 ["chooses K by batch size itself: set adaptive: false"],
                 id="schedule with the controller"),
    pytest.param(sections(speculative={"adaptive": False,
                                       "extra": {"num_speculative_tokens_per_batch_size": []}}),
                 ["use speculative.k_by_batch_size"], id="schedule through extra"),
    pytest.param(sections(speculative={"suffix": {"max_tokens": 4096}}),
                 ["speculative.suffix needs method: suffix on the tree engine"],
                 id="suffix settings without suffix drafts"),
    pytest.param(sections(speculative={"method": "suffix", "engine": "tree",
                                       "suffix": {"min_match": 12, "max_match": 8}}),
                 ["speculative.suffix: min_match 12 is longer than max_match 8"],
                 id="suffix match bounds"),
    pytest.param(sections(speculative={"method": "suffix", "engine": "tree",
                                       "suffix": {"max_tokens": 0}}),
                 ["speculative.suffix.max_tokens: Input should be greater than or equal to 1"],
                 id="suffix index of no tokens"),
    pytest.param(sections(name="a/../../b"), ["name: letters, digits"], id="name with a path"),
    pytest.param(sections(name="a\nb"), ["name: letters, digits"], id="name with a newline"),
    pytest.param(sections(name="x" * 10_000), ["name: at most 64 characters, got 10000"],
                 id="long name"),
    pytest.param(sections(output={"dir": ""}), ["output.dir: empty; name the directory"],
                 id="empty output dir"),
    pytest.param(input_copy_in("data", "data"), ["output.dir:", "holds the input file"],
                 id="output in the input's folder"),
    pytest.param(input_copy_in("in/data", "in"), ["holds the input file"],
                 id="output above the input"),
    pytest.param(input_copy_in("in", "in/out", "in"), ["lies inside input.path"],
                 id="output inside the input directory"),
    pytest.param(input_copy_in("in", "in/out", "in/**/*.parquet"), ["lies inside input.path"],
                 id="output under a recursive input glob"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "needles"), CASES)
def test_bad_job_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, edit: Edit, needles: list[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(edit(tmp_path, job_dict(tmp_path / "out")))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert_user_error(cli("validate", str(job)), *needles)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_tensor_parallel_on_the_cpu_build_without_numa_nodes(tmp_path: Path, monkeypatch) -> None:
    """vLLM's CPU build binds each rank to a NUMA node (or a core list) of its own: 3 ranks
    on a machine of fewer nodes never start (the heads, 9, divide by 3)."""
    if not vllm_cpu_build() or len(numa_nodes()) >= 3:
        pytest.skip("a GPU build of vLLM, or a machine of 3 NUMA nodes")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)  # set by conftest per worker
    job = tmp_path / "job.yaml"
    job.write_text(sections(model={"tensor_parallel_size": 3})(tmp_path, job_dict(tmp_path)))
    needles = ["model.tensor_parallel_size: 3 ranks on vLLM's CPU build need a NUMA node each"]
    assert_user_error(cli("validate", str(job)), *needles)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    assert_user_error(cli("validate", str(job)), "VLLM_CPU_OMP_THREADS_BIND gives 2")


def test_a_binary_job_file_and_a_limit_beyond_64_bits(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_bytes(Path(sys.executable).resolve().read_bytes()[:4096])
    assert_user_error(cli("validate", str(job)), "job.yaml: not a text file")
    job.write_bytes(b"name: x\n\x00\x01")
    assert_user_error(cli("validate", str(job)), "job.yaml: not a text file (control character")
    # A flag's range is click's usage error (three lines, exit 2), as for every flag.
    result = cli("validate", str(ROOT / "jobs" / "synth_data.yaml"), "--limit", "1" + "0" * 30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "Invalid value for '--limit'" in result.stderr


def test_validate_refuses_a_bad_job_in_under_3_s(tmp_path: Path) -> None:
    """The command as a user runs it: no vLLM or torch import on the way to the model checks
    (~0.8 s here). Timed in CPU seconds, which a busy machine does not stretch as it does
    wall time (6 s of wall for 0.8 of CPU was seen under a load of 20)."""
    job = tmp_path / "job.yaml"
    job.write_text(sections(speculative={"method": "mtp"})(tmp_path, job_dict(tmp_path / "out")))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-m", "batchspec", "validate", str(job)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert_user_error(result, "speculative.method: mtp needs a model with MTP layers")
    assert seconds < 3, f"validate took {seconds:.1f} s of CPU"


def test_preparing_the_embedded_model_says_one_line_and_keeps_libraries_quiet(
    tmp_path: Path, monkeypatch
) -> None:
    """On a fresh BATCHSPEC_HOME validate prepares the embedded model (~45 s: here a stand-in
    that copies the prepared one): one line says so; what the libraries print meanwhile, by
    Python or straight to the descriptors, goes to a log beside the model."""
    prepared = models.embedded_dir("smollm2-135m-instruct")

    def convert(_gguf: Path, out: Path) -> None:
        print("Dequantizing  50%|#####     |", file=sys.stderr)
        print("a library's notice")
        os.write(2, b"C++ says hello\n")
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(prepared / name, out / name)

    monkeypatch.setenv("BATCHSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(models, "_convert", convert)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_dict(tmp_path / "out")))
    result = cli("validate", str(job))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "batchspec: preparing the embedded model smollm2-135m-instruct (once, ~45 s)..."
    ]
    assert result.stdout.startswith("spec: ok") and "notice" not in result.stdout
    log = (tmp_path / "home" / "models" / "smollm2-135m-instruct.prepare.log").read_text()
    assert "Dequantizing" in log and "a library's notice" in log and "C++ says hello" in log
