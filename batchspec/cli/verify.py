"""``batchspec verify``: show that speculation left the target's output distribution unchanged."""

from __future__ import annotations

import sys
from typing import Any

import click

from batchspec.cli.common import (
    at_least,
    engine_output,
    examples,
    job_argument,
    load_job,
    output_option,
    set_option,
    user_errors,
    verbose_option,
)

EXIT_FAILED = 1
"""Speculation changed the output, or the sample held nothing to test (no draft accepted)."""


def _num(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join(line(r) for r in [head, *rows])


def format_report(report: dict[str, Any]) -> str:
    """The stdout table of a verify report: one line per check."""
    out = []
    greedy = [c for c in report["checks"] if c["check"] == "greedy"]
    sampled = [c for c in report["checks"] if c["check"] == "sampled"]
    if greedy:
        head = ["greedy", "rows", "identical", "near_ties", "failures", "near_tie_at",
                "min_margin", "max_margin", "max_drift", "result"]  # fmt: skip
        rows = [
            [c["dtype"], str(c["rows"]), str(c["identical"]), str(c["near_ties"]),
             str(c["failures"]), _num(c["near_tie_threshold"]), _num(c["min_margin"]),
             _num(c["max_margin"]), _num(c["max_drift"]), "pass" if c["passed"] else "FAIL"]
            for c in greedy
        ]  # fmt: skip
        out.append(_table(head, rows))
    for c in sampled:
        head = ["sampled", "prompts", "positions", "tests", "rejected", "min_p", "min_p_holm",
                "max_tv_seen", "detectable_tv", "result"]  # fmt: skip
        row = [report["dtype"], str(c["prompts"]), str(c["positions"]), str(c["tests"]),
               str(c["rejected"]), _num(c["min_p"]), _num(c["min_p_holm"]),
               _num(c["max_tv_observed"]), _num(c["detectable_tv_max"]),
               "pass" if c["passed"] else "FAIL"]  # fmt: skip
        out.append(_table(head, [row]))
    return "\n".join(out)


@click.command(
    short_help="Check that speculation leaves JOB's outputs unchanged.",
    epilog=examples(
        "batchspec verify jobs/synth_data.yaml",
        "batchspec verify job.yaml --rows 48 --k 5       # every domain at K=5",
        "batchspec verify job.yaml --set sampling.temperature=0.8 --samples 400",
    ),
)
@job_argument
@output_option
@at_least("--rows", floor=1, default=24, help="Rows compared, spread evenly over the domains.")
@at_least("--samples", floor=2, default=200, help="Sampled jobs: samples per prompt and run.")
@at_least(
    "--tokens",
    floor=1,
    default=4,
    help="Sampled jobs: first generated tokens tested, each on its own.",
)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.05, show_default=True,
              help="Family-wise error rate of the sampled tests (Holm).")  # fmt: skip
@click.option("--near-tie", type=click.FloatRange(min=0), default=None,
              help="Greedy jobs not in float32: largest margin (nats) a divergence may have "
              "to count as numerics [default: 4 x the logprob drift measured].")  # fmt: skip
@click.option("--k", "k", type=click.IntRange(min=1), default=None,
              help="Verify every domain at this K [default: the job's K per domain].")  # fmt: skip
@click.option("--skip-float32", is_flag=True,
              help="Greedy jobs: skip the float32 identity pass (models too big for float32); "
              "the job's own dtype is still checked.")  # fmt: skip
@set_option
@verbose_option()
@user_errors
def verify(
    job: str,
    output: str | None,
    rows: int,
    samples: int,
    tokens: int,
    alpha: float,
    near_tie: float | None,
    k: int | None,
    skip_float32: bool,
    overrides: tuple[str, ...],
) -> None:
    """Check that JOB's speculation leaves the target's output distribution unchanged."""
    from batchspec.io.checks import check_output_dir
    from batchspec.io.layout import OutDir
    from batchspec.measure.verify import verify as run_verify
    from batchspec.measure.verify import write_report
    from batchspec.speculation.route import route_job

    spec = load_job(job, overrides, output)
    check_output_dir(spec.output_dir)  # before the route reads a tuning file there
    spec = route_job(spec, OutDir(spec.output_dir))  # engine auto: the one the job runs on
    s = spec.speculative
    ks = (
        f"K={k}"
        if k is not None
        else f"K={s.num_speculative_tokens}"
        + (f" (per domain: {s.per_domain})" if s.per_domain else "")
    )
    click.echo(
        f"verifying {s.method} {ks} on the {s.engine} engine against plain decoding "
        f"({spec.model.dtype}, temperature {spec.sampling.temperature:g})"
    )
    with engine_output(spec, "verify") as echo:
        report = run_verify(spec, rows, samples, tokens, alpha, near_tie, echo, k, not skip_float32)
    path = write_report(spec.output_dir, report)
    click.echo(format_report(report))
    click.echo(f"report: {path}")
    if report["inconclusive"]:
        click.echo(
            "verify: INCONCLUSIVE: no draft token was accepted in these rows, so nothing "
            "speculation could change was tested (more --rows or --tokens, or other prompts)"
        )
    else:
        if report["domains_without_drafts"]:
            names = ", ".join(report["domains_without_drafts"])
            click.echo(f"note: no draft token accepted in {names}: not tested there")
        click.echo("verify: pass" if report["passed"] else "verify: FAIL")
    if not report["passed"]:
        sys.exit(EXIT_FAILED)
