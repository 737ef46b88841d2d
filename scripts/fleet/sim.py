"""Fleet simulator: W workers over one output directory, counting what each unit costs it.

A simulation of the coordination layer, not of generation: every simulated worker runs the
product's own claiming (``Claims``, ``ClaimingSource``), leasing and heartbeats (``Leases``),
scheduling (``Scheduler``), atomic part commits (``PartWriter``), progress records and their
reading (``ProgressLog``, ``LiveProgress``), shared measurements (``SharedStats``) and failure
records, in the order ``work.worker`` calls them; only the engine is a stand-in that "generates"
each unit after ``--unit-s`` simulated seconds (and the K policy one that keeps K fixed but
shares measurements like the adaptive one). Workers share nothing but the output directory:
each has its own objects, threads and worker name, and a host name of its own, so that no
simulated worker takes the same-host dead-pid shortcut for another (they all live in a few
processes; a killed one is judged by its heartbeat alone, as on a cluster).

Time runs ``--speed`` times faster than production: every period of the product (heartbeat,
lease timeout, linger, progress samples, counting workers, revisits, stats refresh) is divided
by it, so counts per unit and per simulated second are production's. Every filesystem call
under the output directory is counted by kind (``ops.py``). Kills: ``--kills`` workers
vanish mid-unit (no release, no last record); the run checks that every unit is committed
exactly once (every row once) and how long the dead workers' units waited for a new holder.

    python scripts/fleet/sim.py --workers 64          # one fleet size
    python scripts/fleet/sim.py --table               # 16, 64, 256 and 1,000 workers

The last line is ``fleet: W workers, X fs ops per committed unit, Y conflicts per claim,
exactly once: yes|no`` for the largest fleet run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from off import SWITCHES, check, switch_off
from ops import OpCounter
from worker import SimWorker, plan, scale_periods

from batchspec.io.layout import OutDir


def run_process(cfg: dict, index: int, names: list[str], t0: float, result_path: str) -> None:
    """One process of the fleet: its share of the workers as threads, from ``t0``."""
    counter = OpCounter(cfg["out"], t0)
    counter.install()
    switch_off(cfg["off"])
    scale_periods(cfg["speed"])
    units = plan(cfg["units"], cfg["rows"])
    workers = [SimWorker(cfg, name, f"simhost-{name}", units, t0) for name in names]
    kill_at = t0 + cfg["kill_after_s"] / cfg["speed"]
    slow = [w for w in workers if w.slow]  # --slow: the slow worker is the one killed
    killed = 0
    while time.time() < t0:
        time.sleep(0.01)
    for w in workers:
        w.start()
    deadline = t0 + cfg["max_s"]
    while any(w.alive() for w in workers) and time.time() < deadline:
        if killed < cfg["kills"] and time.time() >= kill_at:
            pool = slow if cfg["slow"] > 1 else workers
            victims = [w for w in pool if w.alive() and w.busy()][: cfg["kills"] - killed]
            for w in victims:
                w.vanish()
            killed += len(victims)
        time.sleep(0.05)
    capped = any(w.alive() for w in workers)
    for w in workers:
        w.stop_now()
    data = {
        "ops": dict(counter.kinds),
        "per_second": {str(k): v for k, v in counter.per_second.items()},
        "entries": counter.entries,
        "workers": [w.report() for w in workers],
        "capped": capped,
        "sites": dict(counter.sites or {}),
    }
    Path(result_path).write_text(json.dumps(data))


def check_exactly_once(out: OutDir, units: int, rows: int) -> tuple[bool, int]:
    """Every planned unit committed once, every row once; returns (ok, parts)."""
    parts = out.part_files()
    ids = [p.name[: -len(".parquet")] for p in parts]
    want = {u.unit_id for u in plan(units, rows)}
    rows_seen: list[str] = []
    for p in parts:
        rows_seen += pq.read_table(p, columns=["id"]).column("id").to_pylist()
    ok = len(ids) == len(set(ids)) and set(ids) == want
    ok = ok and len(rows_seen) == len(set(rows_seen)) == units * rows
    return ok, len(parts)


def takeovers(reports: list[dict], speed: float) -> list[tuple[float, str]]:
    """Simulated seconds from each kill to the next claim of each unit the dead one held,
    and how it was found: ``watch`` (a watcher, or the taker of the dead one's other lease)
    or ``try`` (a claim attempt found its lease stale)."""
    claims: dict[str, list[tuple[float, bool]]] = {}
    for r in reports:
        watched = set(r.get("watched", []))
        for t, uid in r["claims"]:
            claims.setdefault(uid, []).append((t, uid in watched))
    waits = []
    for r in reports:
        if r["killed_at"] is None:
            continue
        for uid in r["held_at_kill"]:
            later = [c for c in claims.get(uid, []) if c[0] > r["killed_at"]]
            if later:  # none: the dead one's commit in flight at the kill went through
                t, watched = min(later)
                waits.append(((t - r["killed_at"]) * speed, "watch" if watched else "try"))
    return waits


def exits(reports: list[dict], speed: float) -> dict[int, list]:
    """The workers that ended (not killed) by the exit code ``run`` would give them
    (``work.completion``): how many, and the simulated seconds of the first and last end."""
    found: dict[int, list[float]] = {}
    for w in reports:
        if w["exit_code"] is not None and w["idle_at"] is not None:
            found.setdefault(w["exit_code"], []).append(w["idle_at"] * speed)
    return {code: [len(t), round(min(t)), round(max(t))] for code, t in sorted(found.items())}


def look_gaps(reports: list[dict], speed: float) -> list[float]:
    """Simulated seconds between a live worker's consecutive looks at the one it watches:
    S4's "time a busy worker takes to look again" (``Watch``, every ``WATCH_S`` at most)."""
    gaps = []
    for r in reports:
        times = [t for t, _, _ in r.get("looks", [])]
        gaps += [(b - a) * speed for a, b in itertools.pairwise(times)]
    return sorted(gaps)


def steady_rate(results: list[dict], reports: list[dict], t_end: float, speed: float) -> float:
    """Filesystem ops per worker per simulated second over the middle of the run (after every
    worker had its first unit, before the first ran out of work)."""
    per_second: dict[int, int] = {}
    for r in results:
        for k, v in r["per_second"].items():
            per_second[int(k)] = per_second.get(int(k), 0) + v
    firsts = [r["first_claim"] for r in reports if r["first_claim"] is not None]
    idle = [r["idle_at"] for r in reports if r["idle_at"] is not None] or [t_end]
    lo, hi = int(max(firsts, default=0)) + 1, int(min(idle))
    if hi <= lo:
        lo, hi = 0, max(int(t_end), 1)
    ops = sum(v for k, v in per_second.items() if lo <= k < hi)
    return ops / (len(reports) * (hi - lo) * speed)


def phases(reports: list[dict], speed: float) -> dict[str, list[int]]:
    """[conflicts, claims] by phase of the run: ``start`` until every worker had its first
    unit, ``work`` until the first worker ran out of work, ``end`` after (the kills' takeovers
    and the last units, when most workers walk into units others hold)."""
    firsts = [r["first_claim"] for r in reports if r["first_claim"] is not None]
    idle = [r["idle_at"] for r in reports if r["idle_at"] is not None]
    edges = (max(firsts, default=0.0), min(idle, default=float("inf")))
    out = {"start": [0, 0], "work": [0, 0], "end": [0, 0], "on_killed": [0, 0]}
    killed = {u for r in reports for u in r["held_at_kill"]}

    def phase(t: float) -> str:
        return "start" if t <= edges[0] else "work" if t < edges[1] else "end"

    for r in reports:
        for t, uid in zip(r["conflict_times"], r["conflict_units"], strict=True):
            out[phase(t)][0] += 1
            out["on_killed"][0] += uid in killed  # units a killed worker held
        for t, _ in r["claims"]:
            out[phase(t)][1] += 1
    out["revisits"] = [sum(r["conflict_revisits"] for r in reports), 0]
    for r in reports:  # [conflicts, 0] by what the claimant was doing (CountingClaims)
        for kind, n in r.get("conflict_kinds", {}).items():
            out.setdefault(f"by_{kind}", [0, 0])[0] += n
    out["lingerers"] = [sum(bool(r.get("lingers")) for r in reports), 0]
    out["edges_s"] = [round(e * speed) for e in edges if e != float("inf")]
    return out


def bind(root: Path, units: int, rows: int) -> None:
    """The manifest a run's first worker writes (``prepare.prepare_run``), with the parts layout
    every worker reads from it; a version before the record chooses it (``choose_layout``)."""
    try:
        from batchspec.io.layout import layout_for
        from batchspec.io.manifest import Manifest, claim_output_dir
    except ImportError:
        return
    manifest = Manifest(
        "sim", "sim", None, units, units * rows, time.time(), "sim", parts_layout=layout_for(units)
    )
    claim_output_dir(OutDir(root), manifest)


def simulate(cfg: dict) -> dict:
    """Run one fleet and add up what its processes counted."""
    root = Path(cfg["out"])
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    bind(root, cfg["units"], cfg["rows"])
    names = [f"w{i:05d}" for i in range(cfg["workers"])]
    procs = max(1, min(cfg["procs"], cfg["workers"]))
    t0 = time.time() + 1.0 + 0.002 * cfg["workers"]
    ctx = mp.get_context("fork")
    paths = [f"{root}.p{i}.json" for i in range(procs)]
    shares = [names[i::procs] for i in range(procs)]
    share_cfgs = [
        dict(cfg, kills=cfg["kills"] // procs + (i < cfg["kills"] % procs)) for i in range(procs)
    ]
    ps = [
        ctx.Process(target=run_process, args=(share_cfgs[i], i, shares[i], t0, paths[i]))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    t_end = time.time() - t0
    results = [json.loads(Path(p).read_text()) for p in paths]
    reports = [w for r in results for w in r["workers"]]
    ops: dict[str, int] = {}
    for r in results:
        for k, v in r["ops"].items():
            ops[k] = ops.get(k, 0) + v
    ok, parts = check_exactly_once(OutDir(root), cfg["units"], cfg["rows"])
    sites: dict[str, int] = {}
    for r in results:
        for k, v in r["sites"].items():
            sites[k] = sites.get(k, 0) + v
    errors = [w["error"] for w in reports if w["error"]]
    ok = ok and not errors and not any(r["capped"] for r in results)
    committed = sum(w["committed"] for w in reports)
    claims = sum(w["claimed"] for w in reports)
    conflicts = sum(w["conflicts"] for w in reports)
    firsts = [w["first_claim"] * cfg["speed"] for w in reports if w["first_claim"] is not None]
    waits = takeovers(reports, cfg["speed"])
    return {
        "workers": cfg["workers"],
        "units": cfg["units"],
        "committed": committed,
        "discarded": sum(w["discarded"] for w in reports),
        "ops": ops,
        "ops_per_unit": sum(ops.values()) / max(committed, 1),
        "entries_per_unit": sum(r["entries"] for r in results) / max(committed, 1),
        "ops_per_worker_s": steady_rate(results, reports, t_end, cfg["speed"]),
        "conflicts_per_claim": conflicts / max(claims, 1),
        "phases": phases(reports, cfg["speed"]),
        "first_unit_s": (statistics.median(firsts), max(firsts)) if firsts else (None, None),
        "kills": sum(w["killed_at"] is not None for w in reports),
        "takeover_s": max(w for w, _ in waits) if waits else None,
        "takeovers": sorted((round(w), how) for w, how in waits),
        "look_gaps": look_gaps(reports, cfg["speed"]),
        "exactly_once": ok,
        "exits": exits(reports, cfg["speed"]),
        "parts": parts,
        "wall_s": t_end,
        "errors": errors[:3],
        "sites": dict(sorted(sites.items(), key=lambda kv: -kv[1])),
    }


def row(r: dict) -> str:
    med, worst = r["first_unit_s"]
    take = "-" if r["takeover_s"] is None else f"{r['takeover_s']:.0f}"
    kinds = " ".join(f"{k}={v / max(r['committed'], 1):.1f}" for k, v in sorted(r["ops"].items()))
    return (
        f"| {r['workers']} | {r['units']} | {r['ops_per_unit']:.1f} | {r['ops_per_worker_s']:.2f} "
        f"| {r['entries_per_unit']:.0f} | {r['conflicts_per_claim']:.2f} | {med:.0f} / {worst:.0f} "
        f"| {r['kills']} | {take} "
        f"| {'yes' if r['exactly_once'] else 'no'} | {r['wall_s']:.0f} | {kinds} |"
    )


HEADER = (
    "| workers | units | fs ops / unit | ops / worker / s | listed entries / unit "
    "| conflicts / claim | first unit s (median / max) | kills | takeover s (max) "
    "| exactly once | wall s | ops / unit by kind |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def conflicts_line(ph: dict[str, list[int]]) -> str:
    """Where the conflicts were: by phase (conflicts/claims) and by what the claimant did."""
    by = ", ".join(f"{k[3:]} {v[0]}" for k, v in sorted(ph.items()) if k.startswith("by_"))
    when = ", ".join(f"{k} {ph[k][0]}/{ph[k][1]}" for k in ("start", "work", "end"))
    edges = "/".join(str(e) for e in ph["edges_s"])
    return (
        f"  conflicts/claims: {when} (phases end at {edges} s); by the claimant's state: "
        f"{by or 'none'}; lingerers {ph['lingerers'][0]}"
    )


def takeovers_line(r: dict) -> str:
    """Each of the dead workers' units: seconds from the kill to its new claim, and how."""
    waits = ", ".join(f"{w} {how}" for w, how in r["takeovers"])
    gaps = r["look_gaps"]
    looks = (
        f"; a watcher looks again within {statistics.median(gaps):.0f} s (median), "
        f"{gaps[int(0.99 * (len(gaps) - 1))]:.0f} s (99th percentile), {gaps[-1]:.0f} s (max)"
        if gaps
        else ""
    )
    return f"  takeovers (s after the kill, found by): {waits or 'none'}{looks}"


TABLE = {16: (20.0, 4), 64: (20.0, 4), 256: (10.0, 4), 1000: (2.5, 8)}
"""``--table``'s speed and processes per fleet size, as docs/fleet.md's rows were measured
(a 2-core machine: 256 workers at 35x, 1,000 at 5x or in 4 processes, did not keep up)."""


def config(args: argparse.Namespace, workers: int, out: Path) -> dict:
    """A fleet's settings; ``--speed 0`` picks a speed that keeps commits near 40/s here (the
    table's sizes: ``TABLE``)."""
    speed, procs = TABLE.get(workers, (0.0, args.procs)) if args.table else (0.0, args.procs)
    speed = args.speed or speed or min(60.0, max(4.0, 40 * args.unit_s / (workers * args.depth)))
    return {
        "out": str(out),
        "workers": workers,
        "units": args.units_per_worker * workers,
        "rows": args.rows,
        "unit_s": args.unit_s,
        "depth": args.depth,
        "speed": speed,
        "kills": args.kills if args.kills >= 0 else max(1, workers // 64),
        "kill_after_s": args.kill_at or args.unit_s * args.units_per_worker / (2 * args.depth),
        "slow": args.slow,
        "off": args.off,
        "procs": procs,
        "max_s": args.max_s,
        "heartbeat_s": 20.0,
        "lease_timeout_s": 300.0,
        "linger_s": 300.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--table", action="store_true", help="16, 64, 256 and 1,000 workers")
    ap.add_argument("--units-per-worker", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4, help="rows per unit")
    ap.add_argument("--unit-s", type=float, default=120.0, help="simulated seconds per unit")
    ap.add_argument("--depth", type=int, default=2, help="units an engine holds at once")
    ap.add_argument("--speed", type=float, default=0.0, help="time compression (0: auto)")
    ap.add_argument("--kills", type=int, default=-1, help="workers killed (default W/64)")
    ap.add_argument("--procs", type=int, default=4, help="processes hosting the workers")
    ap.add_argument("--kill-at", type=float, default=0.0, help="simulated s (default: halfway)")
    ap.add_argument(
        "--slow",
        type=float,
        default=1.0,
        help="worker 0's units take this many times longer; "
        "it is the one killed (a death while the others linger)",
    )
    ap.add_argument("--max-s", type=float, default=900.0, help="wall-clock cap per fleet")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: temp)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument(
        "--off",
        type=lambda v: [x for x in v.split(",") if x],
        default=[],
        help=f"mechanisms switched off: {','.join(SWITCHES)} (off.py)",
    )
    args = ap.parse_args()
    check(args.off)  # an unknown name fails here, before a fleet starts
    sizes = [16, 64, 256, 1000] if args.table else [args.workers]
    base = args.out or Path(tempfile.mkdtemp(prefix="sim-fleet-"))
    print(HEADER, flush=True)
    results = []
    for w in sizes:
        r = simulate(config(args, w, base / f"w{w}"))
        results.append(r)
        print(row(r), flush=True)
        print(conflicts_line(r["phases"]), flush=True)
        print(takeovers_line(r), flush=True)
        print(f"  exit codes (code: workers, when s): {r['exits']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
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
