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

from harness import JOBS, abba, balanced, cli, header, ints, options, parser, parts, ratio, run_cli


def figures(job: str, out: Path, sets: list[str], limit: int | None = None) -> dict[str, Any]:
    """``run_cli``'s figures, with what the K controller did per domain from the parts."""
    import polars as pl

    got = run_cli(job, out, sets, limit)
    explored = sum(e["units_explored"] for e in got.pop("engines"))  # every engine's record
    done = parts(out)
    rates = done.group_by("domain").agg(
        pl.col("num_output_tokens").sum() / (pl.col("e2e_s") - pl.col("queue_s")).sum()
    )
    units = done.group_by("domain", "num_speculative_tokens").agg(pl.col("unit_id").n_unique())
    k_units: dict[str, dict[str, int]] = {}
    for d, k, n in units.iter_rows():
        k_units.setdefault(d, {})[str(k)] = n
    # Each target forward (the prefill, every step) emits one token besides the drafts it
    # accepted: forwards = tokens - accepted (one more where a row ended inside a path).
    tokens = done["num_output_tokens"].sum()
    accepted = done["num_accepted_tokens"].fill_null(0).sum()
    return got | {
        "units_explored": explored,
        "domain_rates": dict(rates.iter_rows()),
        "k_units": k_units,
        "tokens_per_forward": tokens / (tokens - accepted),
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
    import numpy as np

    from batchspec.engines.vllm_steps import FEATURES, decode_step_seconds
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
    fill, vector = found[1]["fill"], np.array([coef.get(f, 0.0) for f in FEATURES])
    tau = {k: statistics.fmean(t[k] for t in taus if k in t) for k in fixed}
    ranges: list[list[int]] = []
    for b in range(1, batch + 1):  # tau / step: as the engine's own price (decode_step_seconds)
        k = max(fixed, key=lambda k: (tau[k] / decode_step_seconds(vector, b, k, fill * k), -k))
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
    # A fixed K runs the job's method: drafters are the controller's choice (adaptive alone).
    off = ["speculative.adaptive=false", "speculative.drafters=null"]
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


def off_main_k(k_units: dict[str, dict[str, int]]) -> int:
    """Units that ran at a K other than the one their domain ran most units at."""
    return sum(sum(ks.values()) - max(ks.values()) for ks in k_units.values())


def explored(runs: list[dict[str, Any]]) -> str:
    """Units the adaptive runs spent only to explore: the run log's count, else a proxy."""
    logged = [r["units_explored"] for r in runs]
    if all(x is not None for x in logged):
        return "/".join(str(x) for x in logged) + " (run log)"
    return "/".join(str(off_main_k(r["k_units"])) for r in runs) + " (off main K)"


def efficiency(runs: list[dict[str, Any]], speedup: float) -> str:
    """Tokens per target forward (mean over the rounds) and the speed-up over plain decoding
    divided by it: how much of what the drafts saved in forwards the run turned into speed
    (1.0: a verify costs what a plain step does and drafting is free)."""
    per = [r["tokens_per_forward"] for r in runs if "tokens_per_forward" in r]
    if not per:  # a run saved before the column existed
        return "- | -"
    tpf = statistics.fmean(per)
    return f"{tpf:.2f} | {speedup / tpf:.2f}"


def table(batch: int, res: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """The batch size's table, and adaptive's ratios of means to the best fixed K, the oracle
    and (where it ran) vLLM's schedule."""
    # Complete rounds only (a saved run stopped half-way has more runs of some configurations).
    rounds = min(len(res["runs"][c]) for c in res["configs"])
    runs = {c: res["runs"][c][:rounds] for c in res["configs"]}
    tps = {c: [r["tok_s"] for r in runs[c]] for c in res["configs"]}
    mean = {c: statistics.fmean(v) for c, v in tps.items()}
    fixed = [c for c in res["configs"] if c.startswith("K=")]
    best = max(fixed, key=mean.get)
    lines = [
        f"batch {batch}: generation tok/s per round (ABBA), best fixed K here: {best}",
        "| config | " + " | ".join(f"round {i + 1}" for i in range(rounds))
        + " | mean ± half-range | / K=0 | / best fixed K | tokens / forward | efficiency "
        "| units at K only to explore |",
        "|---" * (rounds + 7) + "|",
    ]  # fmt: skip
    for c in res["configs"]:
        half = (max(tps[c]) - min(tps[c])) / 2
        cells = " | ".join(f"{x:.1f}" for x in tps[c])
        lines.append(f"| {c} | {cells} | {mean[c]:.1f} ± {half:.1f} | "
                     f"{ratio(tps[c], tps[fixed[0]])} | {ratio(tps[c], tps[best])} | "
                     f"{efficiency(runs[c], mean[c] / mean[fixed[0]])} | "
                     f"{explored(runs[c]) if c == 'adaptive' else '-'} |")  # fmt: skip
    lines += notes({**res, "runs": runs})
    lines.append(f"adaptive / best fixed {best}: {ratio(tps['adaptive'], tps[best])} (target >= "
                 f"1.00), adaptive / oracle: {ratio(tps['adaptive'], tps['oracle'])} (target >= "
                 "0.97)")  # fmt: skip
    if "schedule" in tps:
        lines.append(
            "vLLM schedule per round (from the fitted step costs; None: never speculate): "
            + "; ".join(str(x) for x in res.get("schedules", [])[:rounds])
            + f"; adaptive / vLLM schedule: {ratio(tps['adaptive'], tps['schedule'])}"
        )
    over = {"best fixed K": best, "per-domain oracle": "oracle", "vLLM schedule": "schedule"}
    return lines, {name: mean["adaptive"] / mean[c] for name, c in over.items() if c in mean}


def notes(res: dict[str, Any]) -> list[str]:
    """The K each domain ran at, and what replay cost and checked, where the runs logged it."""
    runs = res["runs"]
    lines = ["oracle K per round: " + "; ".join(_kmap(m) for m in res["oracle_k"])]
    for i, r in enumerate(runs["adaptive"], 1):
        used = {d: ",".join(f"{k}x{n}" for k, n in sorted(ks.items()))
                for d, ks in r["k_units"].items()}  # fmt: skip
        lines.append(f"adaptive round {i}, units at K (KxN): " + _kmap(used))
    every = [r for c in res["configs"] for r in runs[c]]
    checked = sum(r.get("replay_checked", 0) for r in every)
    if checked:
        equal = sum(r.get("replay_equal", 0) for r in every)
        share = [r.get("replay_s", 0.0) / r["generate_s"] for r in runs["adaptive"]]
        lines.append(f"replayed acceptance = the engine's own count on {equal}/{checked} rows "
                     "checked (all runs); replay time in adaptive runs: "
                     + "/".join(f"{100 * x:.2f}%" for x in share) + " of generation")  # fmt: skip
    return lines


def _kmap(m: dict[str, Any]) -> str:
    return " ".join(f"{d}={v}" for d, v in sorted(m.items()))


def report(result: dict[str, Any]) -> None:
    """Every batch size's table, then the verdict line for the last one."""
    print(result["setting"])
    verdict = None
    for batch, res in result["batches"].items():
        if min(len(res["runs"][c]) for c in res["configs"]) == 0:
            print(f"\nbatch {batch}: no complete round")
            continue
        lines, over = table(int(batch), res)
        print("\n" + "\n".join(lines))
        verdict = (f"adaptive / best fixed K: {over['best fixed K']:.3f} (batch {batch}), "
                   f"adaptive / per-domain oracle: {over['per-domain oracle']:.3f}")  # fmt: skip
        if "vLLM schedule" in over:
            verdict = f"vllm: {verdict}, adaptive / vLLM schedule: {over['vLLM schedule']:.3f}"
    if verdict:
        print("\n" + verdict)


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
    args.k_grid = sorted(ints(args.k_grid) if args.k_grid else spec.speculative.k_grid)
    if 0 not in args.k_grid:
        raise SystemExit("--k-grid must include 0 (plain decoding is the baseline)")
    batches = ints(args.batches)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    header()
    with tempfile.TemporaryDirectory(prefix="bench-k-choice-") as name:
        tmp = Path(name)
        columns = (spec.input.domain_column, spec.input.id_column)
        df = balanced(spec.input_files(), tmp / "in.parquet", rows=args.rows, columns=columns)
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
