"""Adaptive K against every fixed K and the per-domain oracle, per batch size, in one run.

Everything goes through ``batchspec run``'s code path on the same mixed-domain prompt set, and
is timed the same way (engine starts and shutdowns excluded, everything else counted):

- fixed K in {0, 1, 3, 5, 8}: one engine, ``adaptive: false``;
- oracle: every domain at its own best fixed K, chosen from the first round's fixed-K runs'
  per-domain decode rates (``per_domain``), several engines;
- adaptive: the run with the K controller (``adaptive: true``), starting from one
  ``batchspec tune`` on a small sample made at the start of the batch size (its time is
  reported separately), and learning from its own units as it goes.

This machine's speed drifts by a few percent over minutes, as much as the differences between
K at larger batches. So each batch size runs every configuration ``--rounds`` times, the second
round in reverse order (ABBA), and the ratios are of the means, with each round's own ratio
shown as the spread.

    .venv/bin/python scripts/bench_adaptive.py                       # batch 1, 8, job default
    .venv/bin/python scripts/bench_adaptive.py --batches 8 --per-domain 40 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
FIXED_K = [0, 1, 3, 5, 8]


def subset(spec, per_domain: int, path: Path) -> pl.DataFrame:
    df = pl.concat([pl.read_parquet(f) for f in spec.input_files()])
    dom = spec.input.domain_column
    df = df.group_by(dom, maintain_order=True).head(per_domain).sort(dom, spec.input.id_column)
    df.write_parquet(path)
    return df


def variant(spec, out: Path, batch: int, **speculative):
    return spec.model_copy(
        update={
            "output": spec.output.model_copy(update={"dir": str(out)}),
            "model": spec.model.model_copy(update={"max_num_seqs": batch}),
            "speculative": spec.speculative.model_copy(update=speculative),
        }
    )


def timed_run(spec, limit: int | None = None) -> tuple[float, int, pl.DataFrame, int]:
    """Generation seconds (engine start/stop excluded), output tokens, rows, engines built."""
    from batchspec.work.worker import run_job

    stats = run_job(spec, limit=limit, progress=False)
    seconds = stats.wall_s - stats.engine_build_s - stats.engine_close_s
    rows = pl.read_parquet(Path(spec.output.dir) / "parts" / "*.parquet")
    return seconds, stats.output_tokens, rows, stats.engine_builds


def domain_rates(rows: pl.DataFrame) -> dict[str, float]:
    """Per domain, output tokens per second of row decoding (what the controller measures)."""
    agg = rows.group_by("domain").agg(
        pl.col("num_output_tokens").sum() / (pl.col("e2e_s") - pl.col("queue_s")).sum()
    )
    return dict(agg.iter_rows())


def main() -> None:
    from batchspec.spec.file import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_data.yaml"))
    ap.add_argument("--batches", default=None, help="comma list; default 1,8,<job's>")
    ap.add_argument("--per-domain", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--tune-sample", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as name:
        tmp = Path(name)
        base = load_spec(args.job)
        data = tmp / "in.parquet"
        df = subset(base, args.per_domain, data)
        spec = load_spec(
            args.job,
            [
                f"input.path={data}",
                f"sampling.max_tokens={args.max_tokens}",
                f"speculative.k_grid={FIXED_K}",
            ],
        )
        batches = (
            [int(b) for b in args.batches.split(",")]
            if args.batches
            else sorted({1, 8, base.model.max_num_seqs})
        )
        print(
            f"{df.height} prompts ({args.per_domain} per domain, "
            f"{df[base.input.domain_column].n_unique()} domains), method "
            f"{spec.speculative.method}, max_tokens {args.max_tokens}, dtype {spec.model.dtype}, "
            f"batches {batches}, {args.rounds} rounds; all through batchspec run, engine starts "
            "excluded",
            flush=True,
        )
        # The first run in a process pays one-off costs (imports, tokenizer and chat-template
        # loading, allocator growth) that would otherwise count against whichever config runs
        # first; a short throwaway run absorbs them.
        timed_run(variant(spec, tmp / "warmup", batches[0], adaptive=False), limit=16)
        for batch in batches:
            bench_batch(spec, tmp / f"b{batch}", batch, args.rounds, args.tune_sample)


def bench_batch(spec, tmp: Path, batch: int, rounds: int, tune_sample: int) -> None:
    from batchspec.io.layout import OutDir
    from batchspec.measure.tune import tune

    tuned = tmp / "tuning.json"
    started = time.perf_counter()
    tune(variant(spec, tmp / "tune", batch), tune_sample, [batch], tuned, echo=lambda *_: None)
    tune_s = time.perf_counter() - started
    configs = [f"K={k}" for k in FIXED_K] + ["oracle", "adaptive"]
    tps: dict[str, list[float]] = {c: [] for c in configs}
    rates: dict[int, dict[str, float]] = {}
    best: dict[str, int] = {}
    used_k: dict[str, int] = {}
    engines: dict[str, int] = {}
    for r in range(rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            out = tmp / f"r{r}-{config.replace('=', '')}"
            if config == "oracle":
                s = variant(spec, out, batch, adaptive=False, per_domain=best)
            elif config == "adaptive":
                s = variant(spec, out, batch, adaptive=True)
                OutDir(out).root.mkdir(parents=True)
                shutil.copy(tuned, OutDir(out).tuning)
            else:
                k = int(config[2:])
                s = variant(spec, out, batch, adaptive=False, num_speculative_tokens=k)
            seconds, tokens, rows, engines[config] = timed_run(s)
            tps[config].append(tokens / seconds)
            if config.startswith("K=") and r == 0:
                rates[int(config[2:])] = domain_rates(rows)
                if len(rates) == len(FIXED_K):
                    best = {
                        d: max(FIXED_K, key=lambda k, d=d: rates[k][d]) for d in sorted(rates[0])
                    }
            if config == "adaptive":
                used = rows.group_by("domain").agg(pl.col("num_speculative_tokens").mode().first())
                used_k = dict(used.iter_rows())
    report(batch, tps, best, used_k, engines, tune_s, tune_sample)


def report(batch, tps, best, used_k, engines, tune_s: float, tune_sample: int) -> None:
    mean = {c: statistics.fmean(v) for c, v in tps.items()}
    fixed = [c for c in mean if c.startswith("K=")]
    best_fixed = max(fixed, key=mean.get)
    worst_fixed = min(fixed, key=mean.get)
    domains = sorted(best)

    def ratio(other: str) -> str:
        per_round = [a / o for a, o in zip(tps["adaptive"], tps[other], strict=True)]
        spread = ", ".join(f"{x:.3f}" for x in per_round)
        return f"{mean['adaptive'] / mean[other]:.3f} (rounds {spread})"

    def runs(c: str) -> str:
        return f"{mean[c]:.1f} [" + " ".join(f"{x:.1f}" for x in tps[c]) + "]"

    print(f"\nbatch {batch}: output tokens/s, mean [per round]", flush=True)
    print("  fixed K: " + ", ".join(f"{c} {runs(c)}" for c in fixed))
    print(
        "  oracle (per-domain best fixed K): "
        + ", ".join(f"{d}={best[d]}" for d in domains)
        + f" -> {runs('oracle')} ({engines['oracle']} engines)"
    )
    print(
        "  adaptive (K mostly used): "
        + ", ".join(f"{d}={used_k.get(d)}" for d in domains)
        + f" -> {runs('adaptive')} ({engines['adaptive']} engines; tune on {tune_sample} rows "
        f"per domain {tune_s:.0f} s, not included)"
    )
    print(f"  adaptive / oracle {ratio('oracle')} (target >= 0.97)")
    print(f"  adaptive / best fixed {best_fixed} {ratio(best_fixed)} (target >= 1)")
    print(f"  adaptive / K=0 {ratio('K=0')} (target >= 0.97)")
    print(f"  adaptive / K=5 {ratio('K=5')}; / worst fixed {worst_fixed} {ratio(worst_fixed)}")


if __name__ == "__main__":
    main()
