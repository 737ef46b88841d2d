"""Commands about where and how a run goes: ``slurm submit|status``, ``models``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from batchspec.cli.common import (
    job_argument,
    limit_option,
    load_job,
    output_option,
    set_option,
    user_errors,
)
from batchspec.cli.observe import existing_out, lease_timeout_option, out_argument, print_status
from batchspec.errors import UserError
from batchspec.io.layout import OutDir

if TYPE_CHECKING:
    from batchspec.spec import JobSpec


@click.group()
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
    from batchspec.cluster.slurm import SubmitOptions, render_script, submit
    from batchspec.io.checks import preflight
    from batchspec.work.worker import prepare_run

    spec = load_job(job, overrides, output)
    _check_submit(spec, gpus_per_task, signal_lead)
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
    script = render_script(Path(job).resolve(), out, run_args, opts, max(1, gpus_per_task // tp))
    if dry_run:
        preflight(spec, limit)  # checked, but the output directory is left alone
        click.echo(script, nl=False)
        return
    # Everything checked and the output directory bound before anything is queued.
    _, todo, _ = prepare_run(spec, limit)
    if not todo:
        click.echo(f"nothing to do: every unit of {out} is committed; not submitted")
        return
    job_id = submit(script, out, opts)
    click.echo(
        f"submitted job {job_id}: {tasks} tasks, {len(todo)} units left, logs in {out.slurm}"
    )
    click.echo(job_id)


def _check_submit(spec: JobSpec, gpus_per_task: int, signal_lead: int) -> None:
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


@slurm.command("status")
@out_argument
@lease_timeout_option
@click.option("--json", "as_json", is_flag=True, help="The stable JSON form (README: status).")
@user_errors
def slurm_status(out_dir: str, lease_timeout: float, as_json: bool) -> None:
    """Per-task Slurm state (squeue/sacct) and units done/leased/pending/failed."""
    print_status(existing_out(out_dir), lease_timeout, as_json)


@click.group()
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
