"""``batchspec distill``: train an EAGLE-3 draft head on a job's committed rows."""

from __future__ import annotations

import click

from batchspec.cli.common import (
    at_least,
    examples,
    job_argument,
    load_job,
    output_option,
    set_option,
    user_errors,
)


@click.command(
    short_help="Train a draft head (EAGLE-3) on JOB's committed rows.",
    epilog=examples(
        "batchspec distill jobs/synth_tree.yaml             # -> OUT/drafts/eagle3/",
        "batchspec distill job.yaml --rows 2000 --epochs 4 --vocab 8192",
        "batchspec run job.yaml --set speculative.method=eagle3 "
        "--set speculative.model=OUT/drafts/eagle3",
    ),
)
@job_argument
@output_option
@click.option("--name", default="eagle3", show_default=True,
              help="The head's directory under OUT/drafts/.")  # fmt: skip
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="Use at most N committed rows [default: all].")  # fmt: skip
@click.option("--train-rows", type=click.IntRange(min=1), default=None,
              help="Train on at most N of the rows not held out (the held-out rows stay the "
                   "same: a curve of acceptance over data).")  # fmt: skip
@click.option("--holdout", type=click.FloatRange(0, 1, max_open=True), default=0.1,
              show_default=True,
              help="Fraction of rows held out to measure acceptance.")  # fmt: skip
@at_least("--epochs", floor=1, default=2, help="Passes over the training rows.")
@at_least(
    "--vocab", floor=0, default=4096, help="Draft vocabulary: the N most frequent tokens (0: all)."
)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop training after M minutes (the epoch in progress ends there).")  # fmt: skip
@set_option
@user_errors
def distill(
    job: str,
    output: str | None,
    name: str,
    rows: int | None,
    train_rows: int | None,
    holdout: float,
    epochs: int,
    vocab: int,
    minutes: float | None,
    overrides: tuple[str, ...],
) -> None:
    """Train an EAGLE-3 draft head on JOB's committed rows (its output directory's parts),
    against the target's own next-token distributions, and write it to OUT/drafts/NAME/.
    Run it again with the same options to continue an interrupted training."""
    from batchspec.measure.distill import Options, summary
    from batchspec.measure.distill import distill as run_distill

    spec = load_job(job, overrides, output)
    opts = Options(
        name=name,
        rows=rows,
        train_rows=train_rows,
        holdout=holdout,
        epochs=epochs,
        vocab=vocab,
        minutes=minutes,
    )
    dest, record = run_distill(spec, opts, click.echo)
    click.echo(summary(record))
    click.echo(f"head: {dest} (speculative.method: eagle3, speculative.model: {dest})")
