"""K planning at scale: one scheduling decision with 100 domains and 12 K. A worker's scheduler
over 10,000,000 rows whose K controller measured every (domain, K), timed after a new
measurement, after a unit is taken, and on the engine's per-step call while its batch drains.
Target: a decision <= 5 ms, nothing on the per-step path.

    .venv/bin/python scripts/bench/decide.py
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from harness import ROOT, header, ints, parser

from batchspec.io.layout import OutDir
from batchspec.spec.file import load_spec
from batchspec.speculation.estimator import Observation, expected_tokens
from batchspec.speculation.policy import KPolicy
from batchspec.units import WorkUnit
from batchspec.work.scheduler import Scheduler

GRID = "0,1,2,3,4,5,6,7,8,10,12,16"


def observation(domain: str, k: int, alpha: float, rng: random.Random) -> Observation:
    """One unit's worth of a domain at K: 256 rows, step cost growing with K (batch 64)."""
    steps = 20_000
    tokens_per_step = expected_tokens(alpha, k)
    tokens = int(steps * tokens_per_step)
    step_s = 0.02 * (1 + 0.15 * k) * rng.uniform(0.9, 1.1)
    accepted = tokens - steps
    rate = tokens / (steps * step_s)
    return Observation(
        domain,
        k,
        64,
        rows=256,
        output_tokens=tokens,
        running_s=steps * step_s,
        accepted=accepted if k else 0,
        rejections=int(steps * (1 - alpha**k)) if k else 0,
        spec_steps=steps if k else 0,
        decode_steps=steps,
        rated=256,
        rate_sum=256 * rate,
        rate_sq=256 * rate * rate * 1.01,  # rows' rates spread by 10 %
    )


def build(tmp: Path, domains: int, grid: list[int], rows: int) -> tuple[Scheduler, list[str]]:
    sets = [f"output.dir={tmp}", f"speculative.k_grid={grid}", "model.max_num_seqs=64"]
    spec = load_spec(ROOT / "jobs" / "synth_data.yaml", sets)
    policy = KPolicy(spec, OutDir(tmp), "bench")
    rng = random.Random(0)
    names = [f"domain-{i:03d}" for i in range(domains)]
    for name in names:
        alpha = rng.uniform(0.1, 0.9)
        for k in grid:
            policy.ctl.add(observation(name, k, alpha, rng))
    policy.measured_start(60.0)
    per_unit = 256
    units = [
        WorkUnit(0, "in.parquet", i * per_unit, (i + 1) * per_unit, names[i % domains], per_unit)
        for i in range(rows // per_unit)
    ]
    return Scheduler(units, policy, lambda: 4), names


def timed(fn, repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds of each call, and this thread's CPU seconds (which a busy machine's
    scheduler does not inflate)."""
    wall, cpu = [], []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
    return wall, cpu


def quantiles(seconds: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max, in milliseconds."""
    ms = sorted(t * 1000 for t in seconds)
    return statistics.median(ms), ms[int(0.99 * (len(ms) - 1))], ms[-1]


def main() -> None:
    args = parser(__doc__, domains=100, grid=GRID, rows=10_000_000, repeat=200).parse_args()
    header()
    grid = sorted(set(ints(args.grid)))
    with tempfile.TemporaryDirectory(prefix="bench-decide-") as tmp:
        started = time.perf_counter()
        scheduler, names = build(Path(tmp), args.domains, grid, args.rows)
        print(
            f"{args.domains} domains, K grid {grid}, {args.rows:,} rows in "
            f"{args.rows // 256:,} units, 4 live workers (set up in "
            f"{time.perf_counter() - started:.1f} s)"
        )
        k, _ = scheduler.next_engine(None)
        policy = scheduler.policy
        rng = random.Random(1)

        def after_measurement() -> None:
            policy.ctl.add(observation(rng.choice(names), rng.choice(grid), 0.5, rng))
            scheduler.next_unit(k)

        new = timed(after_measurement, args.repeat)
        taken = timed(lambda: scheduler.next_unit(k), args.repeat)
        plan = policy.decide(scheduler.rows, k, workers=4).plan
        # An engine at a K the plan gives nothing more (off the grid, so no unit rides along):
        # it decides once, then asks again at every step while its batch drains.
        idle_k = max(grid) + 1
        assert scheduler.next_unit(idle_k) is None
        step = timed(lambda: scheduler.next_unit(idle_k), 10 * args.repeat)
        engines = sorted(set(plan.values()))
        print(f"plan: {len(engines)} engine(s) at K {engines} for {len(plan)} domains")
        for label, (wall, cpu) in (("after a new measurement", new), ("after a unit taken", taken)):
            w, c = quantiles(wall), quantiles(cpu)
            print(
                f"decision {label}: wall p50 {w[0]:.2f} ms, p99 {w[1]:.2f} ms, max {w[2]:.2f} ms;"
                f" CPU p50 {c[0]:.2f} ms, p99 {c[1]:.2f} ms, max {c[2]:.2f} ms"
            )
        w, c = quantiles(new[0] + taken[0]), quantiles(new[1] + taken[1])
        print(
            f"scheduling decision p50 {w[0]:.2f} ms, p99 {w[1]:.2f} ms wall ({c[1]:.2f} ms CPU); "
            f"engine step {statistics.median(step[0]) * 1e6:.1f} us"
        )


if __name__ == "__main__":
    main()
