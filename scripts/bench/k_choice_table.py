"""The tables ``k_choice.py`` prints, from its measurements (a run's, or a saved JSON's with
``--table``): per batch size, every configuration's tok/s per round, ratios to K=0 and to the
best fixed K with their spread, what the adaptive runs did per domain, and the verdict."""

from __future__ import annotations

import statistics
from typing import Any

from harness import ratio


def off_main_k(k_units: dict[str, dict[str, int]]) -> int:
    """Units that ran at a K other than the one their domain ran most units at."""
    return sum(sum(ks.values()) - max(ks.values()) for ks in k_units.values())


def explored(runs: list[dict[str, Any]]) -> str:
    """Units the adaptive runs spent only to explore: the run log's count, else a proxy."""
    logged = [r["units_explored"] for r in runs]
    if all(x is not None for x in logged):
        return "/".join(str(x) for x in logged) + " (run log)"
    return "/".join(str(off_main_k(r["k_units"])) for r in runs) + " (off main K)"


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
        + " | mean ± half-range | / K=0 | / best fixed K | units at K only to explore |",
        "|---" * (rounds + 5) + "|",
    ]  # fmt: skip
    for c in res["configs"]:
        half = (max(tps[c]) - min(tps[c])) / 2
        cells = " | ".join(f"{x:.1f}" for x in tps[c])
        lines.append(f"| {c} | {cells} | {mean[c]:.1f} ± {half:.1f} | "
                     f"{ratio(tps[c], tps[fixed[0]])} | {ratio(tps[c], tps[best])} | "
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
