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
@click.option("--output", type=click.Path(file_okay=False), help="Write here, not output.dir.")
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
@click.option("--output", type=click.Path(file_okay=False), help="Output dir (tuning.json).")
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
