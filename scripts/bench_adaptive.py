"""Adaptive K against every fixed K, per batch size, measured side by side in one run.

For each batch size: one engine per fixed K in {0, 1, 3, 5, 8}, every domain's prompts run
through it alone (the K order alternates between batch sizes); the per-domain oracle takes
every domain at its own best fixed K. Then ``batchspec tune``
(small sample, its time reported) and ``batchspec run`` with the adaptive controller over the
whole mixed set. Fixed K and the oracle are timed at the engine (no Parquet, no commits);
adaptive is timed through the whole product path, engine starts and shutdowns excluded.

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


def with_settings(spec, **model):
    return spec.model_copy(update={"model": spec.model.model_copy(update=model)})


def fixed_k_sweep(spec, batch: int, k_values: list[int]):
    """Seconds and tokens per (domain, K): one engine per K, each domain through it alone."""
    from batchspec.checks import preflight
    from batchspec.engine import Engine
    from batchspec.inputs import PromptBuilder
    from batchspec.runner import load_tokenizer
    from batchspec.tune import measure

    pre = preflight(spec)
    tokenizer = load_tokenizer(pre, spec)
    by_domain: dict[str, list] = {}
    for unit in pre.units:
        by_domain.setdefault(unit.domain, []).append(unit)
    bspec = with_settings(spec, max_num_seqs=batch)
    results: dict[tuple[str, int], tuple[float, int]] = {}
    for k in k_values:
        engine = Engine(bspec, k)
        try:
            builder = PromptBuilder(spec.input, tokenizer, engine.max_model_len, None)
            for domain, units in by_domain.items():
                rows = sum(u.num_rows for u in units)
                started = time.perf_counter()
                ob, _ = measure(engine, builder, units, rows, batch)
                results[(domain, k)] = (time.perf_counter() - started, ob.output_tokens)
        finally:
            engine.close()
    return results, list(by_domain)


def adaptive_run(job: Path, spec, batch: int, tmp: Path, sample: int):
    """tune (small sample) then run with the controller; returns timings and K used."""
    from batchspec.controller import tuning_path
    from batchspec.runner import run_job
    from batchspec.tune import tune

    out = tmp / f"adaptive-b{batch}"
    run_spec = with_settings(spec, max_num_seqs=batch).model_copy(
        update={"output": spec.output.model_copy(update={"dir": str(out)})}
    )
    started = time.perf_counter()
    tune(run_spec, sample, [batch], tuning_path(out), echo=lambda *_: None)
    tune_s = time.perf_counter() - started
    stats = run_job(run_spec, progress=False)
    gen_s = stats.wall_s - stats.engine_build_s - stats.engine_close_s
    df = pl.read_parquet(out / "parts" / "*.parquet")
    used = df.group_by("domain").agg(pl.col("num_speculative_tokens").mode().first()).sort("domain")
    return gen_s, stats.output_tokens, tune_s, stats.engine_build_s, len(stats.engines), used


def main() -> None:
    from batchspec.spec import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_data.yaml"))
    ap.add_argument("--batches", default=None, help="comma list; default 1,8,<job's>")
    ap.add_argument("--per-domain", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
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
                "speculative.adaptive=true",
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
            f"batches {batches}; fixed K and oracle timed at the engine, adaptive through "
            "batchspec run (engine starts excluded everywhere)"
        )
        for i, batch in enumerate(batches):
            order = FIXED_K if i % 2 == 0 else FIXED_K[::-1]
            results, domains = fixed_k_sweep(spec, batch, order)
            tokens = {k: sum(results[(d, k)][1] for d in domains) for k in FIXED_K}
            seconds = {k: sum(results[(d, k)][0] for d in domains) for k in FIXED_K}
            tps = {k: tokens[k] / seconds[k] for k in FIXED_K}
            best_k = {
                d: min(FIXED_K, key=lambda k, d=d: results[(d, k)][0] / results[(d, k)][1])
                for d in domains
            }
            oracle = sum(results[(d, best_k[d])][1] for d in domains) / sum(
                results[(d, best_k[d])][0] for d in domains
            )
            gen_s, ad_tok, tune_s, build_s, engines, used = adaptive_run(
                Path(args.job), spec, batch, tmp, args.tune_sample
            )
            adaptive = ad_tok / gen_s
            best_fixed = max(tps, key=tps.get)
            worst_fixed = min(tps, key=tps.get)
            print(f"\nbatch {batch}: output tokens/s")
            print("  fixed K: " + ", ".join(f"K={k} {tps[k]:.1f}" for k in FIXED_K))
            print(
                "  per-domain best fixed K (oracle): "
                + ", ".join(f"{d}={best_k[d]}" for d in domains)
                + f" -> {oracle:.1f}"
            )
            print(
                "  adaptive K used: "
                + ", ".join(f"{d}={k}" for d, k in used.iter_rows())
                + f" -> {adaptive:.1f} ({engines} engines, {build_s:.0f} s of engine starts, "
                f"tune {tune_s:.0f} s not included)"
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
