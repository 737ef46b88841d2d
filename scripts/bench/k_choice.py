"""Does the K controller choose well on data like users'? Adaptive K against every fixed K of
the grid (K=0: plain decoding), the per-domain oracle (``per_domain`` set to each domain's best
K from the fixed-K runs so far) and, on vLLM, vLLM's own batch-size schedule (its K at each
batch size the fastest by the adaptive runs' fitted step costs), each one ``batchspec run`` of
the same balanced rows (default: the long-context set), in ABBA rounds at each batch size.
Figures: generation tok/s from the run logs; ratios of means with their per-round range
(docs/benchmarks.md). The last line, for the last batch size::

    adaptive / best fixed K: X (batch B), adaptive / per-domain oracle: Y

(on vLLM prefixed ``vllm: `` and followed by ``, adaptive / vLLM schedule: Z``)

    .venv/bin/python scripts/bench/k_choice.py --batches 8 --rows 144 --rounds 2
    .venv/bin/python scripts/bench/k_choice.py --table k_choice.json   # a saved run's table
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import JOBS, abba, balanced, cli, header, ints, options, parser, run_cli
from k_choice_table import report


def figures(job: str, out: Path, sets: list[str], limit: int | None = None) -> dict[str, Any]:
    """``run_cli``'s figures, with what the K controller did per domain from the parts."""
    import polars as pl

    got = run_cli(job, out, sets, limit)
    engines = got.pop("engines")
    # Recorded per engine by workers that count them (issue 22); absent from older logs.
    explored = [e["units_explored"] for e in engines if "units_explored" in e]
    parts = pl.read_parquet(out / "parts" / "*.parquet")
    rates = parts.group_by("domain").agg(
        pl.col("num_output_tokens").sum() / (pl.col("e2e_s") - pl.col("queue_s")).sum()
    )
    units = parts.group_by("domain", "num_speculative_tokens").agg(pl.col("unit_id").n_unique())
    k_units: dict[str, dict[str, int]] = {}
    for d, k, n in units.iter_rows():
        k_units.setdefault(d, {})[str(k)] = n
    return got | {
        "units_explored": sum(explored) if explored else None,
        **{
            f"replay_{x}": sum(e.get(f"replay_{x}", 0) for e in engines)
            for x in ("s", "checked", "equal")
        },
        "domain_rates": dict(rates.iter_rows()),
        "k_units": k_units,
    }


def oracle_k(runs: dict[str, list[dict[str, Any]]], fixed: list[int]) -> dict[str, int]:
    """Each domain's best K over the fixed-K runs so far (mean of its per-run rates)."""
    domains = sorted(runs[f"K={fixed[0]}"][0]["domain_rates"])

    def rate(d: str, k: int) -> float:
        return statistics.fmean(r["domain_rates"][d] for r in runs[f"K={k}"])

    return {d: max(fixed, key=lambda k, d=d: rate(d, k)) for d in domains}


def schedule_from(runs: dict[str, list[dict]], fixed: list[int], batch: int) -> list | None:
    """vLLM's batch-size schedule as the fitted step costs imply it: at each batch size b, the
    K of the grid with the most tokens per second, b x tau(K) / step(b, K), tau the replayed
    tokens per step pooled over the domains (mean), step the latest adaptive run's fit of
    vLLM's steps; ranges of equal K merged; None where it never speculates. Without a fit (or
    replay), the best fixed K so far at every batch size."""
    from batchspec.io.layout import OutDir
    from batchspec.observe.report import controller_view
    from batchspec.speculation.steps import read_step_fit

    out = OutDir(Path(runs["adaptive"][-1]["out"])) if runs["adaptive"] else None
    found = read_step_fit(out) if out is not None else None
    view = controller_view(out) if out is not None else None
    coef = (found[1].get("coefficients") if found else None) or {}
    taus = [v.replayed for v in (view[1].values() if view else []) if v.replayed]
    if not coef or not taus:
        best = max(fixed, key=lambda k: statistics.fmean(r["tok_s"] for r in runs[f"K={k}"]))
        return [[1, batch, best]]
    fill = found[1]["fill"]
    tau = {k: statistics.fmean(t[k] for t in taus if k in t) for k in fixed}

    def step(b: int, k: int) -> float:
        spec = coef["spec_rows"] * b if k else 0.0
        return coef["step"] + coef["rows"] * b + spec + coef["drafted"] * b * fill * k

    ranges: list[list[int]] = []
    for b in range(1, batch + 1):
        k = max(fixed, key=lambda k: (tau[k] / step(b, k), -k))
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    return ranges if max(k for *_, k in ranges) > 0 else None


def tuned(args: argparse.Namespace, tmp: Path, common: list[str], batch: int) -> Path | None:
    """With ``--tune N``: ``batchspec tune`` at this batch size, N rows per domain."""
    if not args.tune:
        return None
    out = tmp / f"tune-{batch}"
    sets = [x for s in common for x in ("--set", s)]
    cli("tune", args.job, "--output", str(out), "--batch", str(batch), "--sample", str(args.tune),
        *sets, check=True)  # fmt: skip
    return out / "tuning.json"


def sets_for(config: str, res: dict[str, Any], fixed: list[int], batch: int) -> list[str]:
    """The overrides of one configuration (the oracle and schedule from the runs so far)."""
    if config == "adaptive":
        return ["speculative.adaptive=true"]
    off = ["speculative.adaptive=false"]
    if config == "oracle":
        res["oracle_k"].append(oracle_k(res["runs"], fixed))
        return [*off, f"speculative.per_domain={res['oracle_k'][-1]}"]
    if config == "schedule":
        res["schedules"].append(schedule_from(res["runs"], fixed, batch))
        if res["schedules"][-1] is None:
            return [*off, "speculative.num_speculative_tokens=0"]
        return [*off, f"speculative.k_by_batch_size={res['schedules'][-1]}"]
    return [*off, f"speculative.num_speculative_tokens={config[2:]}"]


def bench_batch(args: argparse.Namespace, data: Path, tmp: Path, batch: int,
                save: Callable[[dict], None]) -> None:  # fmt: skip
    """Every configuration ``args.rounds`` times at one batch size, ABBA; ``save`` gets the
    measurements so far after every run."""
    fixed = args.k_grid
    configs = [f"K={k}" for k in fixed] + ["adaptive", "oracle"]
    configs += ["schedule"] if args.engine == "vllm" else []
    common = [f"input.path={data}", f"model.max_num_seqs={batch}",
              f"sampling.max_tokens={args.max_tokens}", f"output.unit_rows={args.unit_rows}",
              f"speculative.engine={args.engine}", f"speculative.k_grid={fixed}",
              # vLLM drafts chains: the job's tree shape is the tree engine's alone.
              *(["speculative.tree=null"] if args.engine == "vllm" else []), *args.set]  # fmt: skip
    res: dict[str, Any] = {"configs": configs, "runs": {c: [] for c in configs},
                           "oracle_k": [], "schedules": []}  # fmt: skip
    tuning = tuned(args, tmp, common, batch)
    # A throwaway adaptive run absorbs one-off costs first (compilation caches, the page cache,
    # the tree engine's step profile where it is not cached yet).
    warm = figures(args.job, tmp / f"warm-{batch}", [*common, "sampling.max_tokens=8"], 4 * batch)
    print(f"  batch {batch} warm-up: {warm['build_s']:.1f} s engine start (a step profile not "
          f"cached yet is measured there), {warm['generate_s']:.1f} s of generation")  # fmt: skip

    def run(config: str, r: int) -> dict[str, Any]:
        out = tmp / f"b{batch}-r{r}-{config.replace('=', '')}"
        if config == "adaptive" and tuning:
            out.mkdir(parents=True)
            shutil.copy(tuning, out / "tuning.json")
        got = figures(args.job, out, [*common, *sets_for(config, res, fixed, batch)])
        res["runs"][config].append(got)
        save(res)
        return got

    abba(configs, args.rounds, run,
         lambda c, g: f"batch {batch}: {g['tok_s']:.1f} tok/s ({g['tokens']} tokens in "
                      f"{g['generate_s']:.1f} s)")  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """--rows: balanced over the domains; --k-grid: a comma list (default: the job's);
    --tune N: adaptive starts from a tune of N rows per domain; --threads: OMP_NUM_THREADS of
    the runs (1 keeps a run from spinning against other work on a shared machine); --set: an
    override for every run, e.g. model.enforce_eager=true (vLLM starts in ~25 s, not ~120;
    starts are not counted, the steps are eager ones then); --table FILE: print a saved
    run's table (--save's JSON), run nothing."""
    ap = parser(__doc__, job=str(JOBS / "synth_long.yaml"), batches="1,8", rows=144, max_tokens=64)
    options(ap, unit_rows=8, rounds=2, k_grid=None, tune=0, threads=0, save=None, table=None)
    ap.add_argument("--engine", choices=["tree", "vllm"], default="tree")
    ap.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    if args.table:
        report(json.loads(Path(args.table).read_text()))
        return
    from batchspec.spec.file import load_spec

    spec = load_spec(args.job)
    grid = args.k_grid or ",".join(map(str, spec.speculative.k_grid))
    args.k_grid = sorted(int(k) for k in grid.split(","))
    if 0 not in args.k_grid:
        raise SystemExit("--k-grid must include 0 (plain decoding is the baseline)")
    batches = ints(args.batches)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    header()
    with tempfile.TemporaryDirectory(prefix="bench-k-choice-") as name:
        tmp = Path(name)
        df = balanced(spec, tmp / "in.parquet", rows=args.rows)
        counts = dict(sorted(df.group_by(spec.input.domain_column).len().iter_rows()))
        setting = (
            f"{df.height} rows ({' '.join(f'{d}={n}' for d, n in counts.items())}), job "
            f"{Path(args.job).name}, engine {args.engine}, K grid {args.k_grid}, max_tokens "
            f"{args.max_tokens}, unit_rows {args.unit_rows}, batches {batches}, {args.rounds} "
            f"ABBA rounds, threads {args.threads or 'default'}, tune {args.tune or 'none'}, "
            f"overrides {args.set or 'none'}; every figure from batchspec run's log "
            "(generation tok/s, engine start excluded)"
        )
        print(setting, flush=True)
        result: dict[str, Any] = {"setting": setting, "batches": {}}
        for batch in batches:

            def save(partial: dict[str, Any], batch: int = batch) -> None:
                result["batches"][str(batch)] = partial
                if args.save:
                    Path(args.save).write_text(json.dumps(result, indent=1) + "\n")

            bench_batch(args, tmp / "in.parquet", tmp, batch, save)
    report(result)


if __name__ == "__main__":
    main()
