"""How a distilled head's acceptance grows with data (issue 23's D3): ``batchspec distill`` of
one job's committed rows at several training sizes, every point measured on the same held-out
rows (``--train-rows``: the held-out rows are the job's fixed fraction, whatever is trained on).

For each size: training rows and tokens, wall time, the last epoch's loss and top-1
agreement at depth 1, and mean tokens per verify step on the held-out rows (replayed, greedy:
exact) at 4 and 8 nodes, the head's beside n-gram trees'. The last lines fit tokens per step
at 8 nodes against log10(training tokens) and say what the fit gives at a user's job of 100k
rows of this job's length (an extrapolation over orders of magnitude, stated as such).

    .venv/bin/batchspec run jobs/synth_data.yaml --output /tmp/d3/out
    .venv/bin/python scripts/bench/distill_curve.py --job jobs/synth_data.yaml \\
        --output /tmp/d3/out \\
        --train-rows 40,80,160,320 --epochs 6
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from harness import JOBS, cli, flags, header, ints, options, parser


def distill(args: argparse.Namespace, rows: int) -> dict:
    """One distill at ``rows`` training rows (its own head directory); its record."""
    name = f"curve-{rows}-e{args.epochs}"
    sizes = flags(train_rows=rows, epochs=args.epochs, vocab=args.vocab)
    _, took = cli("distill", args.job, *flags(output=args.output, name=name), *sizes, check=True)
    record = json.loads((args.output / "drafts" / name / "record.json").read_text())
    record["wall_s"] = took
    return record


def mean_steps(record: dict, nodes: str, who: str) -> float:
    """Tokens per verify step over the held-out domains (each domain weighs the same)."""
    return statistics.fmean(d[nodes][who] for d in record["held_out"].values())


def main() -> None:
    # --train-rows: the sizes; --rows-per-job: the size of the extrapolation's job.
    ap = parser(__doc__, job=str(JOBS / "synth_data.yaml"), train_rows="40,80,160,320", epochs=6)
    options(ap, vocab=4096, rows_per_job=100_000)
    ap.add_argument("--output", type=Path, required=True, help="the job's output directory")
    args = ap.parse_args()
    header()
    sizes = ints(args.train_rows)
    cols = (
        "train rows | train tokens | wall s | loss | top-1 d1 | head@4 | ngram@4 | head@8 | ngram@8"
    )
    print(f"| {cols} |\n" + "|---" * 9 + "|")
    points = []
    for n in sizes:
        r = distill(args, n)
        last = r["epochs"][-1]
        tokens = r["tokens"]["train"]
        at8 = mean_steps(r, "8", "head")
        points.append((tokens / r["rows"]["train"], tokens, at8))
        print(
            f"| {r['rows']['train']} | {tokens} | {r['wall_s']:.0f} | {last['loss']:.2f} "
            f"| {last['top1_agreement'][0]:.2f} | {mean_steps(r, '4', 'head'):.2f} "
            f"| {mean_steps(r, '4', 'ngram'):.2f} | {at8:.2f} "
            f"| {mean_steps(r, '8', 'ngram'):.2f} |",
            flush=True,
        )
    print(
        f"held out: {r['rows']['held_out']} rows, domains {', '.join(r['held_out'])}; "
        f"{args.epochs} epochs, draft vocabulary {args.vocab}; peak RSS {r['peak_rss_mb']} MB"
    )
    if len(points) >= 2:
        xs = [math.log10(t) for _, t, _ in points]
        ys = [y for _, _, y in points]
        slope, icpt = statistics.linear_regression(xs, ys)  # least squares
        job_tokens = statistics.fmean(p for p, _, _ in points) * args.rows_per_job
        print(
            f"fit: head tokens per step at 8 nodes = {icpt:.2f} + {slope:.3f} * log10(train "
            f"tokens); at {args.rows_per_job:,} rows ({job_tokens:.2g} tokens): "
            f"{icpt + slope * math.log10(job_tokens):.2f} (an extrapolation)"
        )


if __name__ == "__main__":
    main()
