"""``batchspec run-batch -i IN -o OUT``: an OpenAI batch file answered, as ``vllm run-batch``
answers it, with speculation and resume.

The command is a job made from its flags: ``input`` is IN (``format: openai-batch``),
``output.dir`` the work directory (``--work-dir``, default ``OUT.batchspec`` beside OUT), the
model and speculation from vLLM's own flags (``--model``, ``--max-num-seqs``,
``--speculative-config`` as JSON ...) over a job file's (``--job``: anything else a job can say,
such as K per domain or sampling defaults, which each request's body overrides). It runs as
``batchspec run`` runs that job (units committed one by one, so the same command run again
finishes where it stopped), and once every unit is committed it writes OUT whole, in input
order (``export --format openai-batch``), replacing an older OUT atomically. Request errors are
lines of OUT, not a failed command: it exits 0 once OUT is written, and with ``run``'s codes
while work is left (5, 3, 1), OUT then untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from batchspec.cli.common import examples, set_option, user_errors, verbose_option
from batchspec.errors import UserError

if TYPE_CHECKING:
    from batchspec.spec import JobSpec

SPECULATIVE_KEYS = {
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "draft_tensor_parallel_size",
}
"""``--speculative-config`` keys that are the spec's own ``speculative`` keys (vLLM's names);
any other key goes to ``speculative.extra``, passed to vLLM as it is."""


def work_dir_for(output_file: Path, work_dir: str | None) -> Path:
    """The job's output directory: ``--work-dir``, else ``OUT.batchspec`` beside OUT."""
    if work_dir is not None:
        return Path(work_dir).resolve()
    return output_file.resolve().with_name(output_file.name + ".batchspec")


def speculative_section(raw: str | None, job: dict[str, Any]) -> dict[str, Any]:
    """The job's ``speculative`` section with ``--speculative-config``'s keys over it."""
    section = dict(job.get("speculative") or {})
    if raw is None:
        return section
    try:
        given = json.loads(raw)
    except ValueError as exc:
        raise UserError(f"--speculative-config: not JSON ({exc})") from None
    if not isinstance(given, dict):
        raise UserError("--speculative-config: a JSON object, as vLLM takes it")
    extra = dict(section.get("extra") or {})
    for key, value in given.items():
        if key in SPECULATIVE_KEYS:
            section[key] = value
        else:
            extra[key] = value
    if extra:
        section["extra"] = extra
    return section


def batch_job(
    input_file: Path,
    output_file: Path,
    job_path: str | None,
    flags: dict[str, Any],
    overrides: tuple[str, ...],
) -> JobSpec:
    """The job the command runs (see the module's docstring); a bad flag or key is a one-line
    ``UserError`` naming it."""
    from pydantic import ValidationError

    from batchspec.spec import JobSpec
    from batchspec.spec.file import format_validation_error, parse_override

    job, base = _job_file(job_path)
    source = f"--job {job_path}" if job_path else "run-batch"
    system = (job.get("input") or {}).get("system_prompt")
    inp = {"path": str(input_file.resolve()), "format": "openai-batch"}
    job["input"] = inp | ({"system_prompt": system} if system is not None else {})
    work = work_dir_for(output_file, flags.pop("work_dir"))
    job["output"] = dict(job.get("output") or {}) | {"dir": str(work)}
    job["speculative"] = speculative_section(flags.pop("speculative"), job)
    model = dict(job.get("model") or {})
    model.update({k: v for k, v in flags.items() if v is not None})
    job["model"] = model
    for item in overrides:
        key, value = parse_override(item)
        *sections, last = key.split(".")
        node = job
        for name in sections:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {key}: {name!r} is not a section")
        node[last] = value
    if not model.get("model"):
        raise UserError("--model: required (or model.model in the --job file)")
    try:
        return JobSpec(**job, base_dir=str(base))
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source)) from None
    except TypeError as exc:
        raise UserError(f"{source}: {exc}") from None


def _job_file(job_path: str | None) -> tuple[dict[str, Any], Path]:
    """``--job``'s sections (refusing a key given twice, as every job file) and its folder,
    which its relative paths are relative to; none: an empty job, paths relative to here."""
    if job_path is None:
        return {}, Path.cwd()
    from batchspec.spec.file import load_yaml

    path = Path(job_path)
    try:
        job = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--job {job_path}: cannot read it ({exc})") from None
    except UserError:
        raise  # a key given twice, named with both lines
    except Exception as exc:  # YAML's own errors: one line, as load_spec says them
        raise UserError(f"--job {job_path}: invalid YAML ({exc.__class__.__name__})") from None
    if job is None:
        job = {}
    if not isinstance(job, dict):
        raise UserError(f"--job {job_path}: a YAML mapping of job sections")
    return job, path.resolve().parent


@click.command(
    "run-batch",
    short_help="Answer an OpenAI batch file, as vllm run-batch does, resumably.",
    epilog=examples(
        "batchspec run-batch -i requests.jsonl -o results.jsonl --model /models/qwen",
        "batchspec run-batch -i in.jsonl -o out.jsonl --model M --speculative-config "
        + '\'{"method": "ngram"}\'',
        "batchspec run-batch -i requests.jsonl -o results.jsonl --job job.yaml  # the rest",
    ),
)
@click.option(
    "-i",
    "--input-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="Requests: one OpenAI batch request per line.",
)
@click.option(
    "-o",
    "--output-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="Responses: written whole once every request is answered.",
)
@click.option("--model", help="The model (vLLM's --model): a model directory or builtin: name.")
@click.option("--max-num-seqs", type=int, help="Batch size (vLLM's --max-num-seqs).")
@click.option("--max-model-len", type=int, help="Context length (vLLM's --max-model-len).")
@click.option("--dtype", help="auto, float32, bfloat16, float16 (vLLM's --dtype).")
@click.option(
    "--enforce-eager", is_flag=True, default=None, help="No graph capture or compilation (vLLM's)."
)
@click.option("--speculative-config", "speculative", help="vLLM's speculative config as JSON.")
@click.option(
    "--job",
    "job_path",
    type=click.Path(dir_okay=False),
    help="A job file for everything else (speculation, K per domain, sampling defaults).",
)
@click.option(
    "--work-dir", help="The resumable work directory (default: OUT.batchspec beside OUT)."
)
@set_option
@verbose_option()
@click.option("--no-progress", is_flag=True, help="No progress bar or progress lines.")
@user_errors
def run_batch(
    input_file: str,
    output_file: str,
    job_path: str | None,
    overrides: tuple[str, ...],
    no_progress: bool,
    **flags: Any,
) -> None:
    """Answer every request of INPUT_FILE (the OpenAI batch format vllm run-batch reads) into
    OUTPUT_FILE, one response per line in input order; run the same command again to resume."""
    from batchspec.cli.jobs import _print_run
    from batchspec.io.layout import OutDir
    from batchspec.observe.export_lines import export_lines
    from batchspec.work.completion import Exit, completion
    from batchspec.work.worker import run_job

    out_file = Path(output_file)
    spec = batch_job(Path(input_file), out_file, job_path, flags, overrides)
    stats = run_job(spec, None, progress=not no_progress)
    _print_run(stats)
    verdict = completion(OutDir(stats.out_dir))
    if stats.heartbeat_lost or verdict.exit_code not in (Exit.DONE, Exit.ROWS_FAILED):
        click.echo(verdict.line() + "; run the same command again to finish")
        sys.exit(Exit.ERROR if stats.heartbeat_lost else verdict.exit_code)
    r = export_lines(OutDir(spec.output_dir), out_file, "openai-batch", replace=True)
    click.echo(
        f"wrote {r.lines} responses in input order to {out_file} ({r.error_rows} of them "
        f"errors); work directory: {spec.output_dir}"
    )
