"""Commands about where and how a run goes: ``slurm submit|status``, ``models``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from batchspec.cli.common import (
    at_least,
    examples,
    job_argument,
    limit_option,
    load_job,
    output_option,
    set_option,
    user_errors,
    verbose_option,
)
from batchspec.cli.observe import status_command
from batchspec.errors import UserError
from batchspec.io.layout import OutDir

if TYPE_CHECKING:
    from batchspec.cluster.sbatch import SubmitOptions
    from batchspec.spec import JobSpec


@click.group(
    short_help="Run a job as a Slurm array (submit, status).",
    epilog=examples(
        "batchspec slurm submit job.yaml --tasks 8 --gpus-per-task 1 --time 4:00:00",
        "batchspec slurm status out/synth_data",
    ),
)
def slurm() -> None:
    """Run a job as a Slurm array: each array task is one worker of the run."""


def _sbatch_args(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """Each extra argument becomes one ``#SBATCH`` line, so each must be a whole option:
    ``--qos=high``, not ``--qos high`` (whose ``high`` would be a line of its own)."""
    for arg in value:
        if not arg.startswith("-"):
            raise click.BadParameter(
                f"{arg!r} is not an sbatch option; give each as one argument (--qos=high)"
            )
    return value


def _slurm_time(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--time`` as Slurm reads it, refused here rather than by sbatch after the output
    directory is bound."""
    from batchspec.cluster.slurm import time_limit_s

    if value is not None:
        try:
            time_limit_s(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@slurm.command(
    "submit",
    context_settings={"ignore_unknown_options": True},
    short_help="Submit JOB as a Slurm array of workers.",
    epilog=examples(
        "batchspec slurm submit job.yaml --tasks 8 --gpus-per-task 1 --time 4:00:00",
        "batchspec slurm submit job.yaml --tasks 4 --dry-run     # print the script only",
        "batchspec slurm submit job.yaml --tasks 2 --qos=high    # other options: to sbatch",
    ),
)
@job_argument
@at_least(
    "--tasks", floor=1, default=1, help="Array tasks (workers, on as many nodes as Slurm gives)."
)
@at_least(
    "--gpus-per-task",
    floor=0,
    default=0,
    help="GPUs per task; a task runs gpus/tensor_parallel_size workers.",
)
@click.option("--cpus-per-task", type=click.IntRange(min=1), help="CPUs per task.")
@click.option("--partition", help="Slurm partition.")
@click.option(
    "--time",
    "time_limit",
    callback=_slurm_time,
    help="Time limit per task (Slurm format, e.g. 4:00:00 or 1-12).",
)
@click.option("--account", help="Slurm account.")
@at_least(
    "--signal-lead",
    floor=1,
    default=120,
    help="Seconds before the limit that the task is told to stop.",
)
@click.option(
    "--finisher/--no-finisher",
    default=True,
    show_default=True,
    help="Also submit a job that runs once the array has ended and exits with the run's "
    "verdict (0 only when complete): chain a pipeline on it with afterok.",
)
@output_option
@limit_option
@set_option
@click.option("--dry-run", is_flag=True, help="Print the sbatch script(s), submit nothing.")
@verbose_option(expose=True)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED, callback=_sbatch_args)
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
    finisher: bool,
    output: str | None,
    limit: int | None,
    overrides: tuple[str, ...],
    dry_run: bool,
    verbose: bool,
    sbatch_args: tuple[str, ...],
) -> None:
    """Submit JOB as an array of TASKS workers, and a finisher job after it; extra
    SBATCH_ARGS go into the array's script, one #SBATCH line each."""
    from batchspec.cluster.slurm import SubmitOptions, render_finisher, render_script, slurm_cmd
    from batchspec.work.prepare import check_run, prepare_run

    spec = load_job(job, overrides, output)
    _check_submit(spec, gpus_per_task, signal_lead, time_limit)
    tp = spec.model.tensor_parallel_size
    out = OutDir(spec.output_dir)
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
    run_args += ["--verbose"] if verbose else []
    # Both scripts are rendered (every value checked) before anything is written or queued.
    script = render_script(Path(job).resolve(), out, run_args, opts, max(1, gpus_per_task // tp))
    after = render_finisher(out, opts) if finisher else None
    if dry_run:
        check_run(spec, limit)  # checked, but the output directory is left alone
        click.echo(script, nl=False)
        if after is not None:
            click.echo(f"{FINISHER_SEPARATOR}\n{after}", nl=False)
        return
    slurm_cmd("sbatch")  # no Slurm here: refused before the output directory is touched
    # Everything checked and the output directory bound before anything is queued.
    _, todo, _, _ = prepare_run(spec, limit)
    if not todo:
        click.echo(f"nothing to do: every unit of {out} is committed; not submitted")
        return
    _submit(script, after, out, opts, len(todo))


FINISHER_SEPARATOR = (
    "# ---- the finisher's script, submitted with --dependency=afterany:<the array's job id> ----"
)


def _submit(script: str, after: str | None, out: OutDir, opts: SubmitOptions, left: int) -> None:
    """Submit the array, then its finisher; the array's job id is the last line printed."""
    from batchspec.cluster.slurm import submit, submit_finisher

    job_id = submit(script, out, opts)
    click.echo(
        f"submitted job {job_id}: {opts.tasks} tasks, {left} units left, logs in {out.slurm}"
    )
    if after is not None:
        try:
            finisher_id = submit_finisher(after, out, job_id)
        except UserError as exc:
            raise UserError(
                f"job {job_id} is queued, but its finisher is not: {exc}; check the run with "
                f"`batchspec status {out} --require-complete` once the array has ended"
            ) from None
        click.echo(
            f"finisher job {finisher_id}: starts once job {job_id} has ended, exits 0 only if "
            f"the run is complete (chain on it: --dependency=afterok:{finisher_id})"
        )
    click.echo(job_id)


def _check_submit(
    spec: JobSpec, gpus_per_task: int, signal_lead: int, time_limit: str | None
) -> None:
    from batchspec.cluster.slurm import time_limit_s

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
    limit_s = time_limit_s(time_limit) if time_limit is not None else None
    if limit_s is not None and signal_lead >= limit_s:
        raise UserError(
            f"--signal-lead {signal_lead} must be shorter than --time {time_limit} "
            f"({limit_s} s), or tasks are told to stop as they start"
        )


slurm.add_command(
    status_command(
        "slurm status",
        "Slurm task states and the run's status.",
        "Per-task Slurm state (squeue/sacct) and units done/leased/pending/failed.",
    )
)


@click.group(
    short_help="Embedded models: list, prepare.",
    epilog=examples("batchspec models list", "batchspec models prepare smollm2-135m-instruct"),
)
def models() -> None:
    """Embedded models: prepare them once into the local cache."""


@models.command(
    "prepare",
    short_help="Convert an embedded model for vLLM (once).",
    epilog=examples("batchspec models prepare", "batchspec models prepare --force"),
)
@click.argument("name", required=False, default="smollm2-135m-instruct")
@click.option("--force", is_flag=True, help="Rebuild even if already prepared.")
@user_errors
def models_prepare(name: str, force: bool) -> None:
    """Convert embedded model NAME into a vLLM-loadable directory (idempotent)."""
    from batchspec.models import prepare

    click.echo(prepare(name, force=force))


@models.command(
    "list",
    short_help="Embedded models and whether they are prepared.",
    epilog=examples("batchspec models list"),
)
def models_list() -> None:
    """Embedded models and whether they are prepared."""
    from batchspec.models import BUILTIN_PREFIX, CUTS, EMBEDDED, embedded_dir, is_prepared

    for name, m in [*EMBEDDED.items(), *CUTS.items()]:
        state = f"prepared at {embedded_dir(name)}" if is_prepared(name) else "not prepared"
        click.echo(f"{BUILTIN_PREFIX}{name}  {m.description}  [{state}]")
