"""Command line: ``batchspec run | validate | report | models``.

User mistakes (``UserError``) print one line and exit 2, with no traceback; everything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from batchspec.errors import UserError

# The job ran but some units failed repeatedly (recorded under OUT/failed; a rerun retries).
EXIT_UNITS_FAILED = 3


def _quiet_libraries() -> None:
    """vLLM and transformers log at INFO by default; a batch job wants its own summary only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            click.echo(f"batchspec: error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def _load(job: str, overrides: tuple[str, ...], output: str | None):
    from batchspec.spec import load_spec

    items = list(overrides)
    if output is not None:
        # Relative to where the command runs, as a user typing a path expects.
        items.append(f"output.dir={Path(output).resolve()}")
    return load_spec(job, items)


job_argument = click.argument("job", type=click.Path(dir_okay=False))
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a spec key (value read as YAML); repeatable.",
)
output_option = click.option(
    "--output", type=click.Path(file_okay=False), help="Output directory instead of output.dir."
)
limit_option = click.option(
    "--limit", type=click.IntRange(min=1), help="Only the first N rows of the input."
)


@click.group()
@click.version_option(package_name="batchspec")
def main() -> None:
    """Batch offline generation over Parquet with speculative decoding on vLLM."""
    _quiet_libraries()


def _print_run(stats) -> None:
    """The one-screen summary: this invocation, then everything committed, per domain."""
    from batchspec.report import (
        controller_view,
        domain_table,
        format_domain_table,
        read_output,
        with_controller,
    )

    out = Path(stats.out_dir)
    click.echo(f"output: {out}")
    if stats.units_committed == 0 and stats.units_skipped == stats.units_total:
        click.echo(f"nothing to do: all {stats.units_total} units are already committed")
    elif stats.output_tokens_per_s is not None:
        click.echo(
            f"this run: {stats.rows} rows ({stats.error_rows} errors) in "
            f"{stats.units_committed} units, {stats.output_tokens} output tokens, "
            f"{stats.output_tokens_per_s:.1f} output tokens/s over {stats.generate_s:.1f} s of "
            f"generation (+{stats.engine_build_s:.1f} s engine start; wall {stats.wall_s:.1f} s)"
        )
    notes = []
    if stats.units_failed:
        notes.append(f"{stats.units_failed} units failed (see {out / 'failed'}; a rerun retries)")
    if stats.engine_failures:
        notes.append(f"{stats.engine_failures} engine failures recovered")
    if stats.units_abandoned:
        notes.append(f"{stats.units_abandoned} units handed back unfinished")
    if stats.stopped_by_signal:
        notes.append("stopped by signal; rerun to continue")
    if notes:
        click.echo("note: " + "; ".join(notes))
    df = read_output(out)
    click.echo(f"committed: {df.height} rows in {stats.units_total} units")
    click.echo(format_domain_table(with_controller(domain_table(df), controller_view(out))))


@main.command()
@job_argument
@output_option
@limit_option
@set_option
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes on this node; on GPUs each gets tensor_parallel_size GPUs.",
)
@click.option(
    "--retry-errors",
    is_flag=True,
    help="Also generate again the error rows of committed units (kept in OUT/history).",
)
@user_errors
def run(
    job: str,
    output: str | None,
    limit: int | None,
    overrides: tuple[str, ...],
    no_progress: bool,
    workers: int,
    retry_errors: bool,
) -> None:
    """Generate every row of JOB that is not yet in its output directory."""
    from batchspec.runner import run_job

    spec = _load(job, overrides, output)
    if workers == 1:
        stats = run_job(spec, limit=limit, progress=not no_progress, retry_errors=retry_errors)
        _print_run(stats)
        if stats.units_failed:
            sys.exit(EXIT_UNITS_FAILED)
        return
    from batchspec.launch import WorkerError, launch
    from batchspec.runner import prepare_run

    pre, todo, _ = prepare_run(spec, limit, retry_errors)
    args = [job, "--output", str(spec.output_dir), *(f"--set={o}" for o in overrides)]
    if limit is not None:
        args += ["--limit", str(limit)]
    if retry_errors:
        args.append("--retry-errors")
    if not todo:
        from batchspec.runner import RunStats, run_id, worker_name

        stats = RunStats(str(spec.output_dir), run_id(), worker_name(), len(pre.units))
        stats.units_skipped = len(pre.units)
        _print_run(stats)
        return
    try:
        stats = launch(
            args,
            workers,
            spec.model.tensor_parallel_size,
            spec.output_dir,
            len(pre.units),
            len(todo),
            sum(u.num_rows for u in todo),
            progress=not no_progress,
        )
    except WorkerError as exc:
        _print_run(exc.stats)
        click.echo(f"batchspec: error: {exc}", err=True)
        sys.exit(1)
    _print_run(stats)
    if stats.units_failed:
        sys.exit(EXIT_UNITS_FAILED)


@main.command()
@job_argument
@limit_option
@set_option
@user_errors
def validate(job: str, limit: int | None, overrides: tuple[str, ...]) -> None:
    """Check JOB's spec, input files and columns, model paths and draft tokenizer."""
    from batchspec.checks import preflight

    spec = _load(job, overrides, None)
    pre = preflight(spec, limit)
    click.echo(f"spec: ok ({job}, hash {spec.content_hash()})")
    click.echo(f"input: {len(pre.files)} file(s), {pre.num_rows} rows, {len(pre.units)} units")
    domains = ", ".join(f"{d}={n}" for d, n in sorted(pre.domains().items(), key=str))
    click.echo(f"domains: {domains}")
    click.echo(f"model: {pre.target_dir}")
    s = spec.speculative
    if s.method == "none":
        click.echo("speculation: off")
    else:
        draft = f", draft {pre.draft_dir} (tokenizer identical)" if pre.draft_dir else ""
        click.echo(f"speculation: {s.method}, K={s.num_speculative_tokens}{draft}")
    click.echo(f"output: {spec.output_dir}")


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@user_errors
def report(out_dir: str) -> None:
    """Per-domain table of a run's committed output and of the K controller's view."""
    from batchspec.report import (
        controller_view,
        domain_table,
        format_domain_table,
        read_output,
        with_controller,
    )

    path = Path(out_dir)
    if not path.is_dir():
        raise UserError(f"{out_dir}: no such output directory")
    df = read_output(path)
    view = controller_view(path)
    click.echo(f"{path}: {df.height} rows committed")
    if view is not None:
        click.echo(f"K controller at batch {view[0]}: alpha per token, chosen K, tokens/s there")
    click.echo(format_domain_table(with_controller(domain_table(df), view)))


@main.command()
@job_argument
@output_option
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=24,
    show_default=True,
    help="Rows per domain measured at each K.",
)
@click.option("--batch", "batches", help="Comma list of max_num_seqs to sweep (default: job's).")
@set_option
@user_errors
def tune(
    job: str, output: str | None, sample: int, batches: str | None, overrides: tuple[str, ...]
) -> None:
    """Measure tokens/s and acceptance per domain for every K of the grid; write tuning.json."""
    from batchspec.controller import tuning_path
    from batchspec.tune import tune as run_tune

    spec = _load(job, overrides, output)
    try:
        sizes = [int(b) for b in batches.split(",")] if batches else [spec.model.max_num_seqs]
    except ValueError:
        raise UserError(f"--batch {batches!r}: expected a comma list of integers") from None
    path = tuning_path(spec.output_dir)
    click.echo(
        f"tuning {spec.speculative.method} K in {spec.speculative.k_grid} at batch "
        f"{sizes}, {sample} rows per domain"
    )
    run_tune(spec, sample, sizes, path, echo=click.echo)
    click.echo(f"tuning file: {path} (batchspec run on this output directory uses it)")


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--lease-timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Leases older than this are reported stale.",
)
@user_errors
def status(out_dir: str, lease_timeout: float) -> None:
    """Units done / leased / pending / failed of a run, and Slurm tasks if it came from Slurm."""
    _print_status(Path(out_dir), lease_timeout)


def _print_status(out: Path, lease_timeout: float) -> None:
    from batchspec.slurm import submitted_jobs, task_states
    from batchspec.status import format_status, run_status

    if not out.is_dir():
        raise UserError(f"{out}: no such output directory")
    click.echo(format_status(run_status(out, lease_timeout)))
    for job in submitted_jobs(out):
        states = task_states(job["job_id"])
        shown = ", ".join(f"{t}={s}" for t, s in sorted(states.items())) or "no longer known"
        click.echo(f"slurm job {job['job_id']} ({job['tasks']} tasks): {shown}")


@main.group()
def slurm() -> None:
    """Run a job as a Slurm array: each array task is one worker of the run."""


@slurm.command("submit", context_settings={"ignore_unknown_options": True})
@job_argument
@click.option(
    "--tasks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Array tasks (workers, on as many nodes as Slurm gives).",
)
@click.option(
    "--gpus-per-task",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per task; a task runs gpus/tensor_parallel_size workers.",
)
@click.option("--cpus-per-task", type=click.IntRange(min=1), help="CPUs per task.")
@click.option("--partition", help="Slurm partition.")
@click.option("--time", "time_limit", help="Time limit per task (Slurm format, e.g. 4:00:00).")
@click.option("--account", help="Slurm account.")
@click.option(
    "--signal-lead",
    type=click.IntRange(min=1),
    default=120,
    show_default=True,
    help="Seconds before the limit that the task is told to stop.",
)
@output_option
@limit_option
@set_option
@click.option("--dry-run", is_flag=True, help="Print the sbatch script, submit nothing.")
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@user_errors
def slurm_submit(
    job: str,
    tasks: int,
    gpus_per_task: int,
    cpus_per_task: int | None,
    partition: str | None,
    time_limit: str | None,
    account: str | None,
    signal_lead: int,
    output: str | None,
    limit: int | None,
    overrides: tuple[str, ...],
    dry_run: bool,
    sbatch_args: tuple[str, ...],
) -> None:
    """Submit JOB as an array of TASKS workers; extra SBATCH_ARGS go to sbatch as they are."""
    from batchspec.checks import preflight
    from batchspec.runner import prepare_run
    from batchspec.slurm import SubmitOptions, render_script, submit

    spec = _load(job, overrides, output)
    tp = spec.model.tensor_parallel_size
    if gpus_per_task and gpus_per_task % tp:
        raise UserError(
            f"--gpus-per-task {gpus_per_task} is not a multiple of model.tensor_parallel_size {tp}"
        )
    if spec.execution.shutdown_grace_s >= signal_lead:
        raise UserError(
            f"--signal-lead {signal_lead} must exceed execution.shutdown_grace_s "
            f"{spec.execution.shutdown_grace_s:g}, or the limit kills tasks mid-unit"
        )
    opts = SubmitOptions(
        tasks=tasks,
        gpus_per_task=gpus_per_task,
        cpus_per_task=cpus_per_task,
        partition=partition,
        time=time_limit,
        account=account,
        job_name=spec.name,
        signal_lead_s=signal_lead,
        extra=list(sbatch_args),
    )
    run_args = [f"--set={o}" for o in overrides]
    if limit is not None:
        run_args += ["--limit", str(limit)]
    script = render_script(
        Path(job).resolve(), spec.output_dir, run_args, opts, max(1, gpus_per_task // tp)
    )
    if dry_run:
        preflight(spec, limit)  # checked, but the output directory is left alone
        click.echo(script, nl=False)
        return
    # Everything checked and the output directory bound before anything is queued.
    _, todo, _ = prepare_run(spec, limit)
    if not todo:
        click.echo(f"nothing to do: every unit of {spec.output_dir} is committed; not submitted")
        return
    job_id = submit(script, spec.output_dir, opts)
    click.echo(
        f"submitted job {job_id}: {tasks} tasks, {len(todo)} units left, logs in "
        f"{spec.output_dir / 'slurm'}"
    )
    click.echo(job_id)


@slurm.command("status")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--lease-timeout", type=float, default=300.0, show_default=True)
@user_errors
def slurm_status(out_dir: str, lease_timeout: float) -> None:
    """Per-task Slurm state (squeue/sacct) and units done/leased/pending/failed."""
    _print_status(Path(out_dir), lease_timeout)


@main.group()
def models() -> None:
    """Embedded models: prepare them once into the local cache."""


@models.command("prepare")
@click.argument("name", required=False, default="smollm2-135m-instruct")
@click.option("--force", is_flag=True, help="Rebuild even if already prepared.")
@user_errors
def models_prepare(name: str, force: bool) -> None:
    """Convert embedded model NAME into a vLLM-loadable directory (idempotent)."""
    from batchspec.models import prepare

    click.echo(prepare(name, force=force))


@models.command("list")
def models_list() -> None:
    """Embedded models and whether they are prepared."""
    from batchspec.models import BUILTIN_PREFIX, EMBEDDED, embedded_dir, is_prepared

    for name, m in EMBEDDED.items():
        state = f"prepared at {embedded_dir(name)}" if is_prepared(name) else "not prepared"
        click.echo(f"{BUILTIN_PREFIX}{name}  {m.description}  [{state}]")


if __name__ == "__main__":
    main()
