"""Adaptive K against every fixed K and the per-domain oracle, per batch size, in one run.

Everything goes through ``batchspec run``'s code path on the same mixed-domain prompt set, and
is timed the same way (engine starts and shutdowns excluded, everything else counted):

- fixed K in {0, 1, 3, 5, 8}: one engine, ``adaptive: false``;
- oracle: every domain at its own best fixed K, chosen from the fixed-K runs' per-domain
  decode rates of this same benchmark run (``per_domain``), several engines;
- adaptive: ``batchspec tune`` on a small sample (its time reported separately), then the run
  with the K controller (``adaptive: true``), which also keeps learning from its own units.

    .venv/bin/python scripts/bench_adaptive.py                       # batch 1, 8, job default
    .venv/bin/python scripts/bench_adaptive.py --batches 8 --per-domain 40 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
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
    from batchspec.runner import run_job

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
    from batchspec.controller import tuning_path
    from batchspec.spec import load_spec
    from batchspec.tune import tune

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_data.yaml"))
    ap.add_argument("--batches", default=None, help="comma list; default 1,8,<job's>")
    ap.add_argument("--per-domain", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--tune-sample", type=int, default=8)
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
            f"batches {batches}; all through batchspec run, engine starts excluded"
        )
        # The first run in a process pays one-off costs (imports, tokenizer and chat-template
        # loading, allocator growth) that would otherwise count against whichever config runs
        # first; a short throwaway run absorbs them.
        timed_run(variant(spec, tmp / "warmup", batches[0], adaptive=False), limit=16)
        for batch in batches:
            tps, rates = {}, {}
            for k in FIXED_K:
                s = variant(
                    spec, tmp / f"b{batch}-k{k}", batch, adaptive=False, num_speculative_tokens=k
                )
                seconds, tokens, rows, _ = timed_run(s)
                tps[k] = tokens / seconds
                rates[k] = domain_rates(rows)
            domains = sorted(rates[0])
            best = {d: max(FIXED_K, key=lambda k, d=d: rates[k][d]) for d in domains}
            s = variant(spec, tmp / f"b{batch}-oracle", batch, adaptive=False, per_domain=best)
            seconds, tokens, _, oracle_engines = timed_run(s)
            oracle = tokens / seconds
            s = variant(spec, tmp / f"b{batch}-adaptive", batch, adaptive=True)
            started = time.perf_counter()
            tune(
                s, args.tune_sample, [batch], tuning_path(Path(s.output.dir)), echo=lambda *_: None
            )
            tune_s = time.perf_counter() - started
            seconds, tokens, rows, engines = timed_run(s)
            adaptive = tokens / seconds
            used = rows.group_by("domain").agg(pl.col("num_speculative_tokens").mode().first())
            used_k = dict(used.iter_rows())
            best_fixed = max(tps, key=tps.get)
            worst_fixed = min(tps, key=tps.get)
            print(f"\nbatch {batch}: output tokens/s")
            print("  fixed K: " + ", ".join(f"K={k} {tps[k]:.1f}" for k in FIXED_K))
            print(
                "  oracle (per-domain best fixed K): "
                + ", ".join(f"{d}={best[d]}" for d in domains)
                + f" -> {oracle:.1f} ({oracle_engines} engines)"
            )
            print(
                "  adaptive (K mostly used): "
                + ", ".join(f"{d}={used_k.get(d)}" for d in domains)
                + f" -> {adaptive:.1f} ({engines} engines; tune {tune_s:.0f} s not included)"
            )
            print(
                f"  adaptive / oracle {adaptive / oracle:.3f} (target >= 0.97); "
                f"/ best fixed K={best_fixed} {adaptive / tps[best_fixed]:.3f} (target >= 1); "
                f"/ K=0 {adaptive / tps[0]:.3f} (target >= 0.97); "
                f"/ K=5 {adaptive / tps[5]:.3f}; / worst fixed K={worst_fixed} "
                f"{adaptive / tps[worst_fixed]:.3f}"
            )


if __name__ == "__main__":
    main()
