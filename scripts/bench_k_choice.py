"""Does the K controller choose well on data like users'? Adaptive K against plain decoding,
every fixed K of the grid and the per-domain oracle, side by side, in interleaved rounds.

Every configuration is one ``batchspec run`` of the same job on the same rows (a balanced
subset of ``--rows`` rows of the job's input, by default the long-context set
``jobs/synth_long.yaml``: six short domains and two ~750-token ones), at each batch size:

- ``K=k`` for every k of the job's ``speculative.k_grid`` (``adaptive: false``; K=0 is plain
  decoding);
- ``adaptive``: the K controller as a user runs it (``adaptive: true``, no tuning file);
- ``oracle``: ``speculative.per_domain`` set to each domain's best K from the fixed-K runs
  measured so far (tokens per summed row-decode second per domain; at batch > 1 rows overlap, so
  this is an estimate); in the first round it runs after them.
- ``schedule`` (``--engine vllm``): vLLM's own batch-size schedule (``speculative.
  k_by_batch_size``), its K at each batch size the fastest by the latest adaptive run's fitted
  step costs and replayed acceptance (``schedule_from``); in the first round after it.

The figure is generation tokens/s from each run's log (``OUT/runs/*.json``: output tokens over
generation seconds, engine start and shutdown excluded), the run summary's figure. Identical
runs differ by up to 10% on a busy machine, so configurations run in ABBA rounds (``--rounds``:
the order reverses every round) and each ratio is of the means with its per-round range.
"Units only to explore" counts the adaptive run's units that ran off the K its domain ran
most: the run log's own count where the worker records one (``units_explored``), otherwise this
proxy from the committed parts. The last line is the verdict for the last batch size::

    adaptive / best fixed K: X (batch B), adaptive / per-domain oracle: Y

(on vLLM prefixed ``vllm: `` and followed by ``, adaptive / vLLM schedule: Z``)

    .venv/bin/python scripts/bench_k_choice.py --batches 8 --rows 144 --rounds 2
    .venv/bin/python scripts/bench_k_choice.py --batches 1,8 --save k_choice.json
    .venv/bin/python scripts/bench_k_choice.py --table k_choice.json   # the table again
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCHSPEC = str(Path(sys.executable).with_name("batchspec"))


def subset(job: str, rows: int, path: Path) -> dict[str, int]:
    """The first ``rows // domains`` rows of every domain of the job's input, written to
    ``path``; returns the rows per domain."""
    import polars as pl

    from batchspec.spec.file import load_spec

    spec = load_spec(job)
    dom, rid = spec.input.domain_column, spec.input.id_column
    df = pl.concat([pl.read_parquet(f) for f in spec.input_files()])
    per = max(1, rows // df[dom].n_unique())
    df = df.sort(dom, rid).group_by(dom, maintain_order=True).head(per)
    df.write_parquet(path)
    return dict(sorted(df.group_by(dom).len().iter_rows()))


def run_once(job: str, out: Path, sets: list[str], limit: int | None = None) -> dict[str, Any]:
    """One ``batchspec run`` into a fresh ``out``; its figures from the run log and parts."""
    cmd = [BATCHSPEC, "run", job, "--output", str(out), "--no-progress"]
    cmd += ["--limit", str(limit)] if limit else []
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"batchspec run failed ({done.returncode}): {' '.join(cmd)}\n{tail}")
    logs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    tokens = sum(d["output_tokens"] for d in logs)
    seconds = max(d["generate_s"] for d in logs)
    engines = [e for d in logs for e in d["engines"]]
    # Recorded per engine by workers that count them (issue 22); absent from older logs.
    explored = [e["units_explored"] for e in engines if "units_explored" in e]
    return {
        "out": str(out),
        "tok_s": tokens / seconds,
        "tokens": tokens,
        "generate_s": seconds,
        "engine_builds": sum(d["engine_builds"] for d in logs),
        "build_s": sum(d["engine_build_s"] for d in logs),
        "units_explored": sum(explored) if explored else None,
        "replay_s": sum(e.get("replay_s", 0.0) for e in engines),
        "replay_checked": sum(e.get("replay_checked", 0) for e in engines),
        "replay_equal": sum(e.get("replay_equal", 0) for e in engines),
        **per_domain(out),
    }


def per_domain(out: Path) -> dict[str, Any]:
    """Per domain: tokens per summed row-decode second, and units run at each K."""
    import polars as pl

    parts = pl.read_parquet(out / "parts" / "*.parquet")
    rates = parts.group_by("domain").agg(
        pl.col("num_output_tokens").sum() / (pl.col("e2e_s") - pl.col("queue_s")).sum()
    )
    units = parts.group_by("domain", "num_speculative_tokens").agg(pl.col("unit_id").n_unique())
    k_units: dict[str, dict[str, int]] = {}
    for d, k, n in units.iter_rows():
        k_units.setdefault(d, {})[str(k)] = n
    return {"domain_rates": dict(rates.iter_rows()), "k_units": k_units}


def off_main_k(k_units: dict[str, dict[str, int]]) -> int:
    """Units that ran at a K other than the one their domain ran most units at."""
    return sum(sum(ks.values()) - max(ks.values()) for ks in k_units.values())


def oracle_k(runs: dict[str, list[dict[str, Any]]], fixed: list[int]) -> dict[str, int]:
    """Each domain's best K over the fixed-K runs so far (mean of its per-run rates)."""
    domains = sorted(runs[f"K={fixed[0]}"][0]["domain_rates"])

    def rate(d: str, k: int) -> float:
        return statistics.fmean(r["domain_rates"][d] for r in runs[f"K={k}"])

    return {d: max(fixed, key=lambda k, d=d: rate(d, k)) for d in domains}


def schedule_from(
    runs: dict[str, list[dict[str, Any]]], fixed: list[int], batch: int
) -> list[list[int]] | None:
    """vLLM's batch-size schedule as the fitted step costs imply it: at each batch size b, the
    K of the grid with the most tokens per second, b x tau(K) / step(b, K), where tau is the
    replayed tokens per step pooled over the domains (mean) and step the latest adaptive run's
    fit of vLLM's steps (``engines.vllm_steps``); ranges of equal K merged; None where it never
    speculates (that run is plain decoding). Without a fit (or replay), the best fixed K so
    far at every batch size."""
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
    return ranges if max(k for *_, k in ranges) > 0 else None  # None: never speculate


def bench_batch(
    args: argparse.Namespace, data: Path, tmp: Path, batch: int, save: Callable[[dict], None]
) -> dict[str, Any]:
    """Every configuration ``args.rounds`` times at one batch size, the order reversed every
    round; the oracle runs after the fixed K in the first round. ``save`` gets the
    measurements so far after every run."""
    fixed = args.k_grid
    configs = [f"K={k}" for k in fixed] + ["adaptive", "oracle"]
    configs += ["schedule"] if args.engine == "vllm" else []
    common = [
        f"input.path={data}",
        f"model.max_num_seqs={batch}",
        f"sampling.max_tokens={args.max_tokens}",
        f"output.unit_rows={args.unit_rows}",
        f"speculative.engine={args.engine}",
        f"speculative.k_grid={fixed}",
        # vLLM drafts chains: the job's tree shape is the tree engine's alone.
        *(["speculative.tree=null"] if args.engine == "vllm" else []),
        *args.set,
    ]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    oracles: list[dict[str, int]] = []
    schedules: list[list[list[int]] | None] = []
    # A throwaway adaptive run absorbs one-off costs first (compilation caches, the page cache,
    # the tree engine's step profile where it is not cached yet).
    warm = run_once(
        args.job, tmp / f"warmup-{batch}", [*common, "sampling.max_tokens=8"], 4 * batch
    )
    print(
        f"  batch {batch} warm-up: {warm['build_s']:.1f} s engine start (a step profile not "
        f"cached yet is measured there), {warm['generate_s']:.1f} s of generation",
        flush=True,
    )
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            if config == "oracle":
                oracles.append(oracle_k(runs, fixed))
                sets = ["speculative.adaptive=false", f"speculative.per_domain={oracles[-1]}"]
            elif config == "adaptive":
                sets = ["speculative.adaptive=true"]
            elif config == "schedule":
                schedules.append(schedule_from(runs, fixed, batch))
                sets = ["speculative.adaptive=false"]
                if schedules[-1] is None:
                    sets.append("speculative.num_speculative_tokens=0")
                else:
                    sets.append(f"speculative.k_by_batch_size={schedules[-1]}")
            else:
                sets = [
                    "speculative.adaptive=false",
                    f"speculative.num_speculative_tokens={config[2:]}",
                ]
            started = time.perf_counter()
            got = run_once(
                args.job, tmp / f"b{batch}-r{r}-{config.replace('=', '')}", [*common, *sets]
            )
            runs[config].append(got)
            save({"configs": configs, "runs": runs, "oracle_k": oracles, "schedules": schedules})
            print(
                f"  batch {batch} round {r + 1} {config}: {got['tok_s']:.1f} tok/s "
                f"({got['tokens']} tokens in {got['generate_s']:.1f} s; "
                f"{time.perf_counter() - started:.0f} s wall)",
                flush=True,
            )
    return {"configs": configs, "runs": runs, "oracle_k": oracles, "schedules": schedules}


def ratio(num: list[float], den: list[float]) -> str:
    """Ratio of the means, with the range of the per-round ratios."""
    per = [a / b for a, b in zip(num, den, strict=True)]
    spread = f" [{min(per):.3f}-{max(per):.3f}]" if len(per) > 1 else ""
    return f"{statistics.fmean(num) / statistics.fmean(den):.3f}{spread}"


def table(batch: int, res: dict[str, Any]) -> tuple[list[str], float, float, float | None]:
    """The batch size's table; adaptive / best fixed K, / oracle and / vLLM's schedule
    (ratios of means; the last None where the schedule did not run)."""
    # Complete rounds only (a saved run stopped half-way has more runs of some configurations).
    rounds = min(len(res["runs"][c]) for c in res["configs"])
    runs = {c: res["runs"][c][:rounds] for c in res["configs"]}
    res = {**res, "runs": runs}
    tps = {c: [r["tok_s"] for r in runs[c]] for c in res["configs"]}
    mean = {c: statistics.fmean(v) for c, v in tps.items()}
    fixed = [c for c in res["configs"] if c.startswith("K=")]
    best = max(fixed, key=mean.get)
    head = "| config | " + " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [
        f"batch {batch}: generation tok/s per round (ABBA), best fixed K here: {best}",
        head + " | mean ± half-range | / K=0 | / best fixed K | units at K only to explore |",
        "|---" * (rounds + 5) + "|",
    ]
    for c in res["configs"]:
        half = (max(tps[c]) - min(tps[c])) / 2
        explore = "-"
        if c == "adaptive":
            logged = [r["units_explored"] for r in runs[c]]
            if all(x is not None for x in logged):
                explore = "/".join(str(x) for x in logged) + " (run log)"
            else:
                proxy = "/".join(str(off_main_k(r["k_units"])) for r in runs[c])
                explore = f"{proxy} (off main K)"
        cells = " | ".join(f"{x:.1f}" for x in tps[c])
        lines.append(
            f"| {c} | {cells} | {mean[c]:.1f} ± {half:.1f} | {ratio(tps[c], tps[fixed[0]])} "
            f"| {ratio(tps[c], tps[best])} | {explore} |"
        )
    lines += notes(res)
    lines.append(
        f"adaptive / best fixed {best}: {ratio(tps['adaptive'], tps[best])} (target >= 1.00), "
        f"adaptive / oracle: {ratio(tps['adaptive'], tps['oracle'])} (target >= 0.97)"
    )
    if "schedule" in tps:
        lines.append(
            "vLLM schedule per round (from the fitted step costs; None: never speculate): "
            + "; ".join(str(x) for x in res.get("schedules", [])[:rounds])
            + f"; adaptive / vLLM schedule: {ratio(tps['adaptive'], tps['schedule'])}"
        )
    a_best = mean["adaptive"] / mean[best]
    a_oracle = mean["adaptive"] / mean["oracle"]
    a_schedule = mean["adaptive"] / mean["schedule"] if "schedule" in mean else None
    return lines, a_best, a_oracle, a_schedule


def notes(res: dict[str, Any]) -> list[str]:
    """The K each domain ran at, and what replay cost and checked, where the runs logged it."""
    runs = res["runs"]
    lines = ["oracle K per round: " + "; ".join(_kmap(m) for m in res["oracle_k"])]
    for i, r in enumerate(runs["adaptive"], 1):
        used = {
            d: ",".join(f"{k}x{n}" for k, n in sorted(ks.items())) for d, ks in r["k_units"].items()
        }
        lines.append(f"adaptive round {i}, units at K (KxN): " + _kmap(used))
    every = [r for c in res["configs"] for r in runs[c]]
    checked = sum(r.get("replay_checked", 0) for r in every)
    if checked:
        equal = sum(r.get("replay_equal", 0) for r in every)
        share = [r.get("replay_s", 0.0) / r["generate_s"] for r in runs["adaptive"]]
        lines.append(
            f"replayed acceptance = the engine's own count on {equal}/{checked} rows checked "
            f"(all runs); replay time in adaptive runs: "
            + "/".join(f"{100 * x:.2f}%" for x in share)
            + " of generation"
        )
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
        lines, a_best, a_oracle, a_schedule = table(int(batch), res)
        print("\n" + "\n".join(lines))
        verdict = (
            f"adaptive / best fixed K: {a_best:.3f} (batch {batch}), "
            f"adaptive / per-domain oracle: {a_oracle:.3f}"
        )
        if a_schedule is not None:
            verdict = f"vllm: {verdict}, adaptive / vLLM schedule: {a_schedule:.3f}"
    if verdict:
        print("\n" + verdict)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_long.yaml"))
    ap.add_argument("--batches", default="1,8", help="comma list of batch sizes (default 1,8)")
    ap.add_argument("--rows", type=int, default=144, help="rows, balanced over domains")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--unit-rows", type=int, default=8, help="rows per work unit (default 8)")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (default 2)")
    ap.add_argument("--engine", choices=["tree", "vllm"], default="tree")
    ap.add_argument("--k-grid", default=None, help="comma list (default: the job's k_grid)")
    ap.add_argument(
        "--threads",
        type=int,
        help="OMP_NUM_THREADS for the runs (default: the engine's own, a thread per core); "
        "1 keeps a run from spinning against other work on a shared machine",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="a spec override for every run (as batchspec run --set), e.g. "
        "model.enforce_eager=true: vLLM starts in ~25 s instead of ~120 s (starts are not "
        "counted; the steps are eager ones then)",
    )
    ap.add_argument("--save", type=Path, help="write the measurements as JSON here")
    ap.add_argument("--table", type=Path, help="print the table of a saved JSON; run nothing")
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    if args.table:
        report(json.loads(args.table.read_text()))
        return
    from batchspec.spec.file import load_spec

    grid = args.k_grid or ",".join(map(str, load_spec(args.job).speculative.k_grid))
    args.k_grid = sorted(int(k) for k in grid.split(","))
    if 0 not in args.k_grid:
        raise SystemExit("--k-grid must include 0 (plain decoding is the baseline)")
    batches = [int(b) for b in args.batches.split(",")]
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-k-choice-") as name:
        tmp = Path(name)
        counts = subset(args.job, args.rows, tmp / "in.parquet")
        setting = (
            f"{sum(counts.values())} rows ({_kmap(counts)}), job {Path(args.job).name}, engine "
            f"{args.engine}, K grid {args.k_grid}, max_tokens {args.max_tokens}, unit_rows "
            f"{args.unit_rows}, batches {batches}, {args.rounds} ABBA rounds, threads "
            f"{args.threads or 'default'}, overrides {args.set or 'none'}; every figure from "
            "batchspec run's log (generation tok/s, engine start excluded)"
        )
        print(setting, flush=True)
        result: dict[str, Any] = {"setting": setting, "batches": {}}
        for batch in batches:

            def save(partial: dict[str, Any], batch: int = batch) -> None:
                result["batches"][str(batch)] = partial
                if args.save:
                    args.save.write_text(json.dumps(result, indent=1) + "\n")

            bench_batch(args, tmp / "in.parquet", tmp, batch, save)
    report(result)


if __name__ == "__main__":
    main()
