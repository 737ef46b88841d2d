"""Commands that look at a run: ``status``, ``report``, ``export``. None starts an engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from batchspec.cli.common import at_least, examples, user_errors
from batchspec.errors import UserError
from batchspec.io.layout import OutDir

out_argument = click.argument("out_dir", type=click.Path(file_okay=False))


def existing_out(out_dir: str) -> OutDir:
    """OUT_DIR if it is an output directory (``status.check_output_dir``), else a UserError."""
    from batchspec.observe.status import check_output_dir

    out = OutDir(out_dir)
    check_output_dir(out)
    return out


def print_status(
    out: OutDir, lease_timeout: float, as_json: bool, require_complete: bool = False
) -> None:
    """``status`` and ``slurm status``: the run, then the Slurm jobs if it came from Slurm;
    ``require_complete``: then the verdict (``work.completion``) as one line and the exit
    code (0 complete, 3 units failed, 4 error rows, 5 incomplete)."""
    from batchspec.cluster.slurm import submitted_jobs, task_states
    from batchspec.observe.status import run_status
    from batchspec.observe.status_view import format_status, status_json

    st = run_status(out, lease_timeout)
    slurm = [
        {
            "job_id": job["job_id"],
            "tasks": job["tasks"],
            "role": job["role"],
            "states": task_states(job["job_id"]),
        }
        for job in submitted_jobs(out)
    ]
    if as_json:
        click.echo(json.dumps(status_json(st, slurm), indent=2))
    else:
        click.echo(format_status(st))
        for job in slurm:
            states = job["states"]
            shown = ", ".join(f"{t}={s}" for t, s in sorted(states.items())) or "no longer known"
            what = "finisher" if job["role"] == "finisher" else f"({job['tasks']} tasks)"
            click.echo(f"slurm job {job['job_id']} {what}: {shown}")
    if require_complete:
        _verdict(out, st.started, err=as_json)


def _verdict(out: OutDir, started: bool, err: bool) -> None:
    """The run's verdict in one line (on stderr beside JSON), and its exit code."""
    from batchspec.work.completion import Exit, completion

    if not started:  # a directory only tuned so far: no run has bound it yet
        code = Exit.INCOMPLETE
        click.echo(f"incomplete: no run has bound {out} yet (exit {int(code)})", err=err)
    else:
        verdict = completion(out)
        code = verdict.exit_code
        click.echo(verdict.line(), err=err)
    if code:
        sys.exit(int(code))


require_complete_option = click.option(
    "--require-complete",
    is_flag=True,
    help="Exit 0 only if every unit is committed without error rows; else 3 (units failed), "
    "4 (error rows) or 5 (incomplete).",
)


lease_timeout_option = click.option(
    "--lease-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Leases (and workers' progress records) older than this are reported stale (dead).",
)


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The stable JSON form (docs/operations.md: status --json).",
)


def status_command(name: str, short_help: str, doc: str) -> click.Command:
    """``status``, and ``slurm status`` under the ``slurm`` group: one command under two names,
    since both print ``print_status`` (the Slurm jobs too, for a run that came from Slurm)."""

    @click.command(
        name.split()[-1],
        short_help=short_help,
        help=doc,
        epilog=examples(
            f"batchspec {name} out/synth_data",
            f"batchspec {name} out/synth_data --json     # the stable form, for scripts",
            f"batchspec {name} out/synth_data --require-complete   # exit 0 only when complete",
        ),
    )
    @out_argument
    @lease_timeout_option
    @json_option
    @require_complete_option
    @user_errors
    def show(out_dir: str, lease_timeout: float, as_json: bool, require_complete: bool) -> None:
        print_status(existing_out(out_dir), lease_timeout, as_json, require_complete)

    return show


status = status_command(
    "status",
    "Units, rows, throughput, ETA and K of a run.",
    "Units done / leased / pending / failed, rows, throughput, ETA and K per domain.",
)


@click.command(
    short_help="Per-domain table of a run's output, and plots.",
    epilog=examples(
        "batchspec report out/synth_data",
        "batchspec report out/synth_data --markdown --plots out/synth_data/plots",
    ),
)
@out_argument
@click.option("--plots", type=click.Path(file_okay=False), help="Write PNG plots into DIR.")
@click.option("--markdown", is_flag=True, help="The table in Markdown.")
@user_errors
def report(out_dir: str, plots: str | None, markdown: bool) -> None:
    """Per-domain table of a run's committed output (with the K controller's view), and plots."""
    from batchspec.observe.drafter_view import drafter_view, format_drafter_view
    from batchspec.observe.report import format_domain_table, format_k_view, full_report
    from batchspec.observe.step_view import format_step_fit

    out = existing_out(out_dir)
    scan, table, view = full_report(out)
    rows = int(table["rows"].sum()) if not table.is_empty() else 0
    if not markdown:
        click.echo(f"{out}: {rows} rows committed")
        if view is not None:
            click.echo(f"K controller at batch {view[0]}: alpha per token, chosen K, tokens/s")
    click.echo(format_domain_table(table, markdown=markdown))
    if view is not None and format_k_view(view, markdown):
        click.echo("\n" + format_k_view(view, markdown))
    drafters = drafter_view(out)
    if drafters is not None:
        click.echo("\n" + format_drafter_view(drafters, markdown))
    if not markdown and format_step_fit(out):
        click.echo("\n" + format_step_fit(out))
    if plots is not None:
        if table.is_empty():
            raise UserError(f"{out}: no rows committed; nothing to plot")
        from batchspec.observe.plots import write_plots

        for path in write_plots(scan, table, Path(plots)):
            click.echo(f"plot: {path}", err=markdown)


@click.command(
    short_help="Write a run's rows as a Hugging Face dataset, or as JSON lines.",
    epilog=examples(
        "batchspec export out/synth_data --to datasets/synth_data",
        "batchspec export out/synth_data --to datasets/so_far --allow-unfinished",
        "batchspec export out/synth_data --to datasets/sft --columns generation",
        "batchspec export out/requests --to results.jsonl --format openai-batch",
    ),
)
@out_argument
@click.option(
    "--to", "dest", required=True, type=click.Path(), help="New dataset folder (or file)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl", "openai-batch"]),
    default="parquet",
    show_default=True,
    help="parquet: a Hugging Face dataset folder; jsonl: a file of one row per line; "
    "openai-batch: a file of one response per input row, as vllm run-batch writes them.",
)
@click.option(
    "--include-errors/--drop-errors",
    default=True,
    show_default=True,
    help="Keep error rows (error set, generation columns null) or leave them out.",
)
@click.option("--allow-unfinished", is_flag=True, help="Export what is committed so far.")
@at_least("--shard-mb", floor=0.01, default=500.0, help="Largest shard size in MB (zstd Parquet).")
@click.option(
    "--prompts/--no-prompts",
    default=True,
    show_default=True,
    help="Export the input's prompt (or messages) column beside the generation, or leave it out.",
)
@click.option(
    "--columns",
    default="all",
    show_default=True,
    metavar="PROFILE|NAMES",
    help="Which columns: generation (ids, prompt, generation, token counts, finish reason, "
    "error), acceptance (and the speculative counts and rates), all (and timings, unit ids); "
    "or column names, with or without a profile: generation,e2e_s. Profiles leave out nested "
    "columns null in every row (logprobs where none were asked).",
)
@user_errors
def export(
    out_dir: str,
    dest: str,
    include_errors: bool,
    allow_unfinished: bool,
    shard_mb: float,
    prompts: bool,
    fmt: str,
    columns: str,
) -> None:
    """Write OUT_DIR's rows in input order as one Hugging Face dataset (Parquet shards,
    dataset card), or as one JSON lines file (``--format``)."""
    from batchspec.observe.export import export_dataset

    out = existing_out(out_dir)
    if fmt != "parquet":
        from batchspec.observe.export_lines import export_lines

        lines = export_lines(
            out, Path(dest), fmt, include_errors, allow_unfinished, prompts, columns=columns
        )
        errors = "kept" if include_errors else "left out"
        click.echo(
            f"exported {lines.rows} rows in input order to {lines.dest} as {fmt} "
            f"({lines.lines} lines; {lines.error_rows} error rows {errors})"
        )
        return
    r = export_dataset(
        out, Path(dest), include_errors, allow_unfinished, shard_mb, prompts, columns
    )
    errors = "kept" if include_errors else "left out"
    missing = f", {r.missing_rows} rows not generated yet" if r.missing_rows else ""
    shown = f"prompts in `{r.prompt_column}`" if r.prompt_column else "no prompt column"
    click.echo(
        f"exported {r.rows} rows in input order to {r.dest} ({r.shards} shard(s), "
        f"{r.bytes / 1e6:.1f} MB; {shown}; {r.error_rows} error rows {errors}{missing})"
    )
