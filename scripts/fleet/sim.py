"""Fleet simulator: W workers over one output directory, counting what each unit costs it.

A simulation of the coordination layer, not of generation: every simulated worker runs the
product's own claiming, leases, heartbeats, scheduling, part commits, progress records, shared
measurements and failure records (``worker.py``); only the engine is a stand-in. Workers share
nothing but the directory; they live as threads in ``--procs`` processes. Time runs
``--speed`` times faster than production (every period of the product divided by it), so
counts per unit and per simulated second are production's. Every filesystem call under the
directory is counted by kind (``ops.py``). ``--kills`` workers vanish mid-unit; the run checks
that every unit is committed exactly once (every row once) and how long the dead workers' units
waited for a new holder. docs/fleet.md has the figures.

    python scripts/fleet/sim.py --workers 64          # one fleet size
    python scripts/fleet/sim.py --table               # 16, 64, 256 and 1,000 workers

The last line is ``fleet: W workers, X fs ops per committed unit, Y conflicts per claim,
exactly once: yes|no`` for the largest fleet run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from harness import options, parser
from ops import OpCounter
from standins import SWITCHES, job, plan, scale_periods
from worker import SimWorker

from batchspec.io.layout import OutDir, layout_for
from batchspec.io.manifest import Manifest, claim_output_dir


def run_process(cfg: dict, names: list[str], t0: float, result_path: str, ended: Barrier) -> None:
    """One process of the fleet: its share of the workers as threads, from ``t0``; kills its
    share of ``kills`` busy workers (the slow one with ``--slow``) at the kill time. It lives
    until every process is done (``ended``), so that no worker's pid is ever found dead: a
    killed worker is judged by its silence, as on another host."""
    counter = OpCounter(cfg["out"], t0)
    counter.install()
    scale_periods(cfg["speed"], cfg["off"])
    units, spec = plan(cfg["units"], cfg["rows"]), job(cfg["out"], cfg["speed"])
    workers = [SimWorker(cfg, spec, units, name, t0) for name in names]
    kill_at, killed = t0 + cfg["kill_after_s"] / cfg["speed"], 0
    pool = [w for w in workers if w.slow] if cfg["slow"] > 1 else workers
    time.sleep(max(0.0, t0 - time.time()))
    for w in workers:
        w.thread.start()
    deadline = t0 + cfg["max_s"]
    while any(w.running() for w in workers) and time.time() < deadline:
        if killed < cfg["kills"] and time.time() >= kill_at:
            victims = [w for w in pool if w.running() and w.busy()]
            for w in victims[: cfg["kills"] - killed]:
                w.vanish()
                killed += 1
        time.sleep(0.05)
    capped = any(w.running() for w in workers)
    for w in workers:
        w.stop_now()
    data = {
        "ops": counter.kinds,
        "per_second": counter.per_second,
        "entries": counter.entries,
        "workers": [w.report() for w in workers],
        "capped": capped,
        "sites": counter.sites,
    }
    Path(result_path).write_text(json.dumps(data))
    with contextlib.suppress(threading.BrokenBarrierError):
        ended.wait(timeout=max(deadline - time.time(), 0) + 60)


def exactly_once(out: OutDir, units: int, rows: int) -> tuple[bool, int]:
    """Every planned unit committed once, every row once; returns (ok, parts)."""
    parts = out.part_files()
    ids = [p.name[: -len(".parquet")] for p in parts]
    seen = [x for p in parts for x in pq.read_table(p, columns=["id"]).column("id").to_pylist()]
    ok = len(ids) == len(set(ids)) and set(ids) == {u.unit_id for u in plan(units, rows)}
    return ok and len(seen) == len(set(seen)) == units * rows, len(parts)


def takeovers(reports: list[dict], speed: float) -> list[tuple[float, str, float]]:
    """Simulated seconds from each kill to the next claim of each unit the dead one held (its
    engine got it), how it was found: ``watch`` (a watcher, or the taker of its other lease)
    or ``try``, and seconds from the kill to its lease (a watcher leases the units at its
    look, and its engine gets them at its next pull, after a unit of its own at worst)."""
    claims: dict[str, list[tuple[float, bool]]] = {}
    leased: dict[str, list[float]] = {}
    for r in reports:
        for t, uid in r["claims"]:
            claims.setdefault(uid, []).append((t, uid in r["watched"]))
        for t, uid in r["retired"]:
            leased.setdefault(uid, []).append(t)
    waits = []
    for r in (r for r in reports if r["killed_at"] is not None):
        for uid in r["held_at_kill"]:
            later = [c for c in claims.get(uid, []) if c[0] > r["killed_at"]]
            if later:  # none: the dead one's commit in flight at the kill went through
                t, watched = min(later)
                lease = min([x for x in leased.get(uid, []) if r["killed_at"] < x <= t] or [t])
                how = "watch" if watched else "try"
                waits.append(((t - r["killed_at"]) * speed, how, (lease - r["killed_at"]) * speed))
    return sorted(waits)


def exits(reports: list[dict], speed: float) -> dict[int, list]:
    """Workers that ended (not killed) by the exit code ``run`` would give them: how many, and
    the simulated seconds of the first and last end."""
    found: dict[int, list[float]] = {}
    for w in reports:
        if w["exit_code"] is not None and w["idle_at"] is not None:
            found.setdefault(w["exit_code"], []).append(w["idle_at"] * speed)
    return {code: [len(t), round(min(t)), round(max(t))] for code, t in sorted(found.items())}


def edges(reports: list[dict]) -> tuple[float, float]:
    """When every worker had its first unit, and when the first ran out of work."""
    firsts = [r["first_claim"] for r in reports if r["first_claim"] is not None]
    idle = [r["idle_at"] for r in reports if r["idle_at"] is not None]
    return max(firsts, default=0.0), min(idle, default=float("inf"))


def steady_rate(per_second: Counter, reports: list[dict], t_end: float, speed: float) -> float:
    """Filesystem ops per worker per simulated second while every worker had work."""
    start, end = edges(reports)
    lo, hi = int(start) + 1, int(min(end, t_end))
    if hi <= lo:
        lo, hi = 0, max(int(t_end), 1)
    ops = sum(v for k, v in per_second.items() if lo <= int(k) < hi)
    return ops / (len(reports) * (hi - lo) * speed)


def phases(reports: list[dict], speed: float) -> dict[str, list[int]]:
    """[conflicts, claims] by phase: ``start`` until every worker had a unit, ``work`` until
    the first ran out, ``end`` after; conflicts on units a killed worker held, by what the
    claimant was doing (``by_...``), lingering workers, and the phases' ends in seconds."""
    start, end = edges(reports)
    out = {"start": [0, 0], "work": [0, 0], "end": [0, 0], "on_killed": [0, 0]}
    killed = {u for r in reports for u in r["held_at_kill"]}

    def phase(t: float) -> str:
        return "start" if t <= start else "work" if t < end else "end"

    for r in reports:
        for t, uid in r["conflicts"]:
            out[phase(t)][0] += 1
            out["on_killed"][0] += uid in killed
        for t, _ in r["claims"]:
            out[phase(t)][1] += 1
        for kind, n in r["conflict_kinds"].items():
            out.setdefault(f"by_{kind}", [0, 0])[0] += n
    out["lingerers"] = [sum(bool(r["lingers"]) for r in reports), 0]
    out["edges_s"] = [round(e * speed) for e in (start, end) if e != float("inf")]
    return out


def simulate(cfg: dict) -> dict:
    """Run one fleet and add up what its processes counted."""
    root = Path(cfg["out"])
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    units, speed = cfg["units"], cfg["speed"]
    # The manifest a run's first worker writes, with the parts layout every worker reads.
    rows, layout = units * cfg["rows"], layout_for(units)
    manifest = Manifest("sim", "sim", None, units, rows, time.time(), "sim", parts_layout=layout)
    claim_output_dir(OutDir(root), manifest)
    names = [f"w{i:05d}" for i in range(cfg["workers"])]
    procs = max(1, min(cfg["procs"], cfg["workers"]))
    t0 = time.time() + 1.0 + 0.002 * cfg["workers"]
    paths = [f"{root}.p{i}.json" for i in range(procs)]
    ps, fork = [], mp.get_context("fork")
    ended = fork.Barrier(procs)
    for i in range(procs):
        share = dict(cfg, kills=cfg["kills"] // procs + (i < cfg["kills"] % procs))
        args = (share, names[i::procs], t0, paths[i], ended)
        ps.append(fork.Process(target=run_process, args=args))
        ps[-1].start()
    for p in ps:
        p.join()
    t_end = time.time() - t0
    results = [json.loads(Path(p).read_text()) for p in paths]
    reports = [w for r in results for w in r["workers"]]
    total = {
        key: sum((Counter(r[key]) for r in results), Counter())
        for key in ("ops", "per_second", "sites")
    }
    ok, parts = exactly_once(OutDir(root), units, cfg["rows"])
    errors = [w["error"] for w in reports if w["error"]]
    committed = sum(w["committed"] for w in reports)
    per_unit, claims = max(committed, 1), max(sum(len(w["claims"]) for w in reports), 1)
    firsts = [w["first_claim"] * speed for w in reports if w["first_claim"] is not None]
    waits = takeovers(reports, speed)
    gaps = sorted((b - a) * speed for r in reports for a, b in itertools.pairwise(r["looks"]))
    return {
        "workers": cfg["workers"],
        "units": units,
        "committed": committed,
        "discarded": sum(w["discarded"] for w in reports),
        "ops": dict(total["ops"]),
        "ops_per_unit": total["ops"].total() / per_unit,
        "entries_per_unit": sum(r["entries"] for r in results) / per_unit,
        "ops_per_worker_s": steady_rate(total["per_second"], reports, t_end, speed),
        "conflicts_per_claim": sum(len(w["conflicts"]) for w in reports) / claims,
        "phases": phases(reports, speed),
        "first_unit_s": (statistics.median(firsts), max(firsts)) if firsts else (0, 0),
        "kills": sum(w["killed_at"] is not None for w in reports),
        "takeover_s": max((w for w, _, _ in waits), default=None),
        "leased_s": max((x for _, _, x in waits), default=None),
        "takeovers": [(round(w), how, round(x)) for w, how, x in waits],
        "look_gaps": gaps,
        "exactly_once": ok and not errors and not any(r["capped"] for r in results),
        "exits": exits(reports, speed),
        "parts": parts,
        "wall_s": t_end,
        "errors": errors[:3],
        "sites": dict(total["sites"].most_common()),
    }


HEADER = (
    "| workers | units | fs ops / unit | ops / worker / s | listed entries / unit "
    "| conflicts / claim | first unit s (median / max) | kills | takeover s (max) "
    "| exactly once | wall s | ops / unit by kind |\n" + "| --- " * 12 + "|"
)


def lines(r: dict) -> list[str]:
    """The table row, where the conflicts were, each takeover, and the exit codes."""
    med, worst = r["first_unit_s"]
    take = "-" if r["takeover_s"] is None else f"{r['takeover_s']:.0f}"
    kinds = " ".join(f"{k}={v / max(r['committed'], 1):.1f}" for k, v in sorted(r["ops"].items()))
    ph, gaps = r["phases"], r["look_gaps"]
    by = ", ".join(f"{k[3:]} {v[0]}" for k, v in sorted(ph.items()) if k.startswith("by_"))
    when = ", ".join(f"{k} {ph[k][0]}/{ph[k][1]}" for k in ("start", "work", "end"))
    waits = ", ".join(f"{w} {how}" + (f" ({x})" if x != w else "") for w, how, x in r["takeovers"])
    looks = ""
    if gaps:
        p99 = gaps[int(0.99 * (len(gaps) - 1))]
        looks = (
            f"; a watcher looks again within {statistics.median(gaps):.0f} s (median), "
            f"{p99:.0f} s (99th percentile), {gaps[-1]:.0f} s (max)"
        )
    return [
        f"| {r['workers']} | {r['units']} | {r['ops_per_unit']:.1f} | {r['ops_per_worker_s']:.2f}"
        f" | {r['entries_per_unit']:.0f} | {r['conflicts_per_claim']:.2f} | {med:.0f} / "
        f"{worst:.0f} | {r['kills']} | {take} | {'yes' if r['exactly_once'] else 'no'} | "
        f"{r['wall_s']:.0f} | {kinds} |",
        f"  conflicts/claims: {when} (phases end at {'/'.join(map(str, ph['edges_s']))} s); by "
        f"the claimant's state: {by or 'none'}; lingerers {ph['lingerers'][0]}",
        f"  takeovers (s after the kill, found by; leased at, when sooner): {waits or 'none'}"
        f"{looks}",
        f"  exit codes (code: workers, when s): {r['exits']}",
    ]


TABLE = {16: (20.0, 4), 64: (20.0, 4), 256: (10.0, 4), 1000: (2.5, 8)}
"""``--table``'s speed and processes per fleet size, as docs/fleet.md's rows were measured
(a 2-core machine: 256 workers at 35x, 1,000 at 5x or in 4 processes, did not keep up)."""


def config(args: argparse.Namespace, workers: int, out: Path) -> dict:
    """A fleet's settings; ``--speed 0`` picks a speed that keeps commits near 40/s here."""
    speed, procs = TABLE.get(workers, (0.0, args.procs)) if args.table else (0.0, args.procs)
    speed = args.speed or speed or min(60.0, max(4.0, 40 * args.unit_s / (workers * args.depth)))
    kills = args.kills if args.kills >= 0 else max(1, workers // 64)
    kill_at = args.kill_at or args.unit_s * args.units_per_worker / (2 * args.depth)
    units = args.units_per_worker * workers
    return vars(args) | {
        "out": str(out),
        "workers": workers,
        "units": units,
        "speed": speed,
        "kills": kills,
        "kill_after_s": kill_at,
        "procs": procs,
    }


def parse() -> argparse.Namespace:
    """--table: 16, 64, 256 and 1,000 workers; --rows: rows per unit; --unit-s: simulated
    seconds per unit; --depth: units an engine holds at once; --speed: time compression (0:
    auto); --kills: workers killed (-1: W/64); --procs: processes hosting the workers;
    --kill-at: simulated seconds (0: halfway); --slow: worker 0's units take this many times
    longer, and it is the one killed (a death while the others linger); --max-s: wall-clock
    cap per fleet; --out: output directory (default: temp); --json: the results written
    there; --off: mechanisms switched off, comma-separated (``SWITCHES``)."""
    ap = parser(__doc__, workers=256, table=False, units_per_worker=8, rows=4, unit_s=120.0)
    options(ap, depth=2, speed=0.0, kills=-1, procs=4, kill_at=0.0, slow=1.0, max_s=900.0)
    args = options(ap, out=None, json=None, off="").parse_args()
    args.off = [x for x in args.off.split(",") if x]
    if unknown := set(args.off) - set(SWITCHES):
        ap.error(f"--off: unknown mechanism {sorted(unknown)} (one of {', '.join(SWITCHES)})")
    return args


def main() -> None:
    args = parse()
    base = Path(args.out or tempfile.mkdtemp(prefix="sim-fleet-")).resolve()
    # Each simulated engine start is remembered (``engines.starts``): not in the user's cache.
    os.environ["BATCHSPEC_CACHE"] = str(base / "cache")
    print(HEADER, flush=True)
    results = []
    for w in [16, 64, 256, 1000] if args.table else [args.workers]:
        results.append(simulate(config(args, w, base / f"w{w}")))
        print("\n".join(lines(results[-1])), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.out is None:
        shutil.rmtree(base, ignore_errors=True)
    r = results[-1]
    print(
        f"fleet: {r['workers']} workers, {r['ops_per_unit']:.1f} fs ops per committed unit, "
        f"{r['conflicts_per_claim']:.2f} conflicts per claim, "
        f"exactly once: {'yes' if r['exactly_once'] else 'no'}"
    )


if __name__ == "__main__":
    main()
