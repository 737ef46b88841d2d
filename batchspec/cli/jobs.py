"""The job commands: ``run``, ``validate``, ``tune``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from batchspec.cli.common import (
    at_least,
    engine_output,
    examples,
    job_argument,
    limit_option,
    load_job,
    output_option,
    set_option,
    user_errors,
    verbose_option,
)
from batchspec.errors import UserError

if TYPE_CHECKING:
    from batchspec.io.checks import Preflight
    from batchspec.spec import JobSpec
    from batchspec.work.runlog import RunStats


def _print_run(stats: RunStats) -> None:
    from batchspec.observe.report import run_summary

    click.echo(run_summary(stats))


def _finish(stats: RunStats) -> None:
    """Print the summary and the verdict on the whole plan, and exit with its code
    (``work.completion.Exit``): 0 only when every unit is committed without error rows."""
    from batchspec.io.layout import OutDir
    from batchspec.work.completion import Exit, completion

    _print_run(stats)
    verdict = completion(OutDir(stats.out_dir))
    click.echo(verdict.line())
    if stats.heartbeat_lost:
        click.echo(f"batchspec: error: {stats.heartbeat_lost}", err=True)
        sys.exit(Exit.ERROR)
    sys.exit(verdict.exit_code)


@click.command(
    short_help="Generate the rows of JOB not yet in its output directory.",
    epilog=examples(
        "batchspec run jobs/synth_data.yaml",
        "batchspec run job.yaml --limit 100 --output out/try --set sampling.max_tokens=64",
        "batchspec run job.yaml --workers 4      # 4 workers on this node's GPUs or cores",
    ),
)
@job_argument
@output_option
@limit_option
@set_option
@verbose_option()
@click.option("--no-progress", is_flag=True, help="No progress bar or progress lines.")
@at_least(
    "--log-every",
    floor=1,
    default=30.0,
    help="When stderr is not a terminal (Slurm logs, CI): seconds between progress lines.",
)
@at_least(
    "--workers",
    floor=1,
    default=1,
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
    log_every: float,
    workers: int,
    retry_errors: bool,
) -> None:
    """Generate every row of JOB that is not yet in its output directory; run it again to
    resume after a stop or a crash."""
    from batchspec.work.worker import run_job

    spec = load_job(job, overrides, output)
    if workers == 1:
        stats = run_job(
            spec, limit, progress=not no_progress, retry_errors=retry_errors, log_every=log_every
        )
    else:
        args = [job, "--output", str(spec.output_dir), *(f"--set={o}" for o in overrides)]
        args += ["--limit", str(limit)] if limit is not None else []
        args += ["--retry-errors"] if retry_errors else []
        progress = (not no_progress, log_every)
        stats = _run_workers(spec, args, limit, retry_errors, workers, progress)
    _finish(stats)


def _run_workers(
    spec: JobSpec,
    args: list[str],
    limit: int | None,
    retry_errors: bool,
    workers: int,
    progress: tuple[bool, float],
) -> RunStats:
    """``run --workers N``: N worker processes of one run on this node, their stats summed."""
    from batchspec.cluster.launch import WorkerError, launch
    from batchspec.io.layout import OutDir
    from batchspec.work.prepare import prepare_run
    from batchspec.work.runlog import RunStats, run_id, worker_name

    pre, todo, _, _ = prepare_run(spec, limit, retry_errors)
    if not todo:
        stats = RunStats(str(spec.output_dir), run_id(), worker_name(), len(pre.units))
        stats.units_skipped = len(pre.units)
        return stats
    try:
        return launch(
            args,
            workers,
            spec.model.tensor_parallel_size,
            OutDir(spec.output_dir),
            len(pre.units),
            len(todo),
            sum(u.num_rows for u in todo),
            progress=progress[0],
            log_every=progress[1],
        )
    except WorkerError as exc:
        _print_run(exc.stats)
        click.echo(f"batchspec: error: {exc}", err=True)
        sys.exit(1)


@click.command(
    short_help="Check JOB (spec, input, models, output directory).",
    epilog=examples(
        "batchspec validate jobs/synth_data.yaml",
        "batchspec validate job.yaml --limit 100 --set speculative.method=none",
    ),
)
@job_argument
@limit_option
@set_option
@user_errors
def validate(job: str, limit: int | None, overrides: tuple[str, ...]) -> None:
    """Check JOB's spec, input files and columns, model paths, draft tokenizer and output
    directory, everything a run checks first, and start nothing."""
    from batchspec.work.prepare import check_run

    spec = load_job(job, overrides, None)
    pre, _, routed = check_run(spec, limit)  # what a run checks first, nothing written
    click.echo(f"spec: ok ({job}, hash {spec.content_hash()})")
    click.echo(f"input: {len(pre.files)} file(s), {pre.num_rows} rows, {len(pre.units)} units")
    domains = ", ".join(f"{d}={n}" for d, n in sorted(pre.domains().items(), key=str))
    click.echo(f"domains: {domains}")
    click.echo(f"model: {pre.target_dir}")
    click.echo(f"engine: {_engine_line(spec, pre, routed)}")
    click.echo(f"output: {spec.output_dir}")


def _engine_line(spec: JobSpec, pre: Preflight, routed: JobSpec) -> str:
    """Which engine serves the job (``routed``: on the engine ``check_run`` routed it to),
    with what: ``validate``'s answer."""
    from batchspec.spec.tree import AUTO, TREE, VLLM

    s = spec.speculative
    if s.method == "none":
        return f"{'vLLM' if s.engine == VLLM else 'batchspec tree engine'}; speculation: off"
    layers = s.tree.draft_layers if s.tree is not None else None
    source = "" if s.method != "draft_model" else f", drafted by {s.model or 'the target'}"
    source += f" cut to {len(layers)} layers" if layers else ""
    tree = (
        f"batchspec's tree engine (torch + transformers): {s.method} trees, "
        f"K={s.num_speculative_tokens} draft nodes per step{source}"
    )
    draft = f", draft {pre.draft_dir} (tokenizer identical)" if pre.draft_dir else ""
    chains = f"vLLM, {s.method} chains, K={s.num_speculative_tokens}{draft}"
    if s.engine != AUTO:
        return tree if s.engine == TREE else chains
    how = f"{routed.speculative.engine}, as batchspec tune measured at batch "
    how += str(spec.model.max_num_seqs)
    return f"auto: the faster of {tree}, and {chains}; now {how}"


@click.command(
    short_help="Measure tokens/s per K and domain; write tuning.json.",
    epilog=examples(
        "batchspec tune jobs/synth_data.yaml",
        "batchspec tune job.yaml --sample 32 --batch 1,8,64   # then: batchspec run job.yaml",
    ),
)
@job_argument
@output_option
@at_least(
    "--sample",
    floor=1,
    default=16,
    help="Rows per domain measured at each K and batch size; at least the batch size (a "
    "full batch; a domain with fewer rows repeats them).",
)
@click.option("--batch", "batches", help="Comma list of max_num_seqs to sweep (default: job's).")
@set_option
@verbose_option()
@user_errors
def tune(
    job: str,
    output: str | None,
    sample: int,
    batches: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Measure tokens/s and acceptance per domain for every K of the grid; write tuning.json."""
    from batchspec.io.layout import OutDir
    from batchspec.measure.tune import tune as run_tune

    spec = load_job(job, overrides, output)
    try:
        sizes = [int(b) for b in batches.split(",")] if batches else [spec.model.max_num_seqs]
    except ValueError:
        sizes = [0]
    if min(sizes) < 1:
        raise UserError(f"--batch {batches!r}: expected a comma list of batch sizes >= 1")
    path = OutDir(spec.output_dir).tuning
    rows = ", ".join(f"{max(sample, b)} at batch {b}" for b in sizes)
    click.echo(
        f"tuning {spec.speculative.method} K in {spec.speculative.k_grid} on engine "
        f"{spec.speculative.engine}; rows per domain and K: {rows}"
    )
    with engine_output(spec, "tune") as echo:
        run_tune(spec, sample, sizes, path, echo=echo)
    click.echo(f"tuning file: {path} (batchspec run on this output directory uses it)")
