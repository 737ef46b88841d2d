"""How well the tree engine's step profile predicts its real steps, and what it costs: an engine
measures its profile (a first run) and a second loads it; the sample's rows then run in units
at mixed K (``--ks``), each step's seconds set against the profile's forward alone and the
profile as the run's steps corrected it (``step_check``, what the K controller reads); the
same rows at K=0 must give the same tokens. Printed per node count: steps, real ms, and each
prediction's median error and summed ratio.

    .venv/bin/python scripts/bench/step_profile.py --job jobs/synth_long.yaml --batch 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict

from harness import JOBS, header, ints, parser
from tree_lib import sample, variant


def parse() -> argparse.Namespace:
    # --rows: the first N prompts of every domain; --ks: the units' K, dealt out row by row.
    job = str(JOBS / "synth_tree.yaml")
    return parser(__doc__, job=job, rows=3, max_tokens=64, batch=8, ks="0,2,4,8").parse_args()


class Recorder:
    """Wraps ``StepProfile.observe``: each real step beside its two predictions."""

    def __init__(self, profile) -> None:
        self.profile, self.observe = profile, profile.observe
        self.steps: list[tuple[int, int, float, float, float]] = []
        profile.observe = self

    def __call__(self, batch: int, nodes: int, seconds: float) -> None:
        p = self.profile
        self.steps.append(
            (batch, nodes, seconds, p.forward_seconds(batch, nodes), p.seconds(batch, nodes))
        )
        self.observe(batch, nodes, seconds)


def units(smp, ks: list[int]):
    from batchspec.units import UnitRequests, WorkUnit

    out = []
    for i, k in enumerate(ks):
        rows = smp.rows[i :: len(ks)]
        unit = WorkUnit(0, smp.unit.path, i, i + 1, f"k{k}", len(rows))
        out.append(UnitRequests(unit, rows, k=k))
    return out


def report(steps: list[tuple[int, int, float, float, float]]) -> None:
    by_nodes: dict[int, list] = defaultdict(list)
    for s in steps:
        by_nodes[s[1]].append(s)
    print(f"{'nodes':>5} {'steps':>6} {'real ms':>8}  {'forward: med err':>16} {'sum ratio':>9}"
          f"  {'checked: med err':>16} {'sum ratio':>9}")  # fmt: skip
    for nodes, group in [*sorted(by_nodes.items()), ("all", steps)]:
        real = [g[2] for g in group]
        cols = []
        for idx in (3, 4):
            pred = [g[idx] for g in group]
            err = statistics.median(abs(p / r - 1) for p, r in zip(pred, real, strict=True))
            cols.append(f"{100 * err:>15.1f}% {sum(pred) / sum(real):>9.2f}")
        mean_ms = 1000 * statistics.mean(real)
        print(f"{nodes!s:>5} {len(group):>6} {mean_ms:>8.1f}  {cols[0]}  {cols[1]}")


def main() -> None:
    args = parse()
    header()
    os.environ["BATCHSPEC_CACHE"] = tempfile.mkdtemp(prefix="profile-bench-")
    from batchspec.engines import ListSource, open_engine
    from batchspec.observe.step_view import format_profile_check  # as ``report`` prints it
    from batchspec.spec.file import load_spec

    spec = load_spec(args.job, [f"sampling.max_tokens={args.max_tokens}"])
    ks = ints(args.ks)
    job = variant(spec, args.batch, spec.speculative.tree.model_dump(), k_grid=sorted(set(ks)))
    smp = sample(spec, args.rows)
    eng = open_engine(job, max(ks))
    profile = eng.step_profile
    cells = len(profile.batches) * len(profile.nodes)
    print(f"profile: {cells} cells (batches {profile.batches} x nodes {profile.nodes}), "
          f"measured in {profile.measured_s:.2f} s (first run)")  # fmt: skip
    eng.close()
    eng = open_engine(job, max(ks))
    started = time.perf_counter()
    profile = eng.step_profile
    print(f"profile loaded by a second build in {time.perf_counter() - started:.4f} s")
    rec = Recorder(profile)
    started = time.perf_counter()
    done = list(eng.run(ListSource(units(smp, ks)), lambda: False))
    wall = time.perf_counter() - started
    tokens = sum(r.num_output_tokens or 0 for d in done for r in d.results)
    print(f"{len(smp.rows)} rows at K {ks} (batch {args.batch}): {len(rec.steps)} steps, "
          f"{tokens} tokens in {wall:.1f} s; per-step real vs predicted:")  # fmt: skip
    report(rec.steps)
    print(format_profile_check(args.batch, profile.summary(args.batch, sorted(set(ks)))))
    plain = list(eng.run(ListSource(units(smp, [0] * len(ks))), lambda: False))
    eng.close()
    want = {r.request.row: r.token_ids for d in plain for r in d.results}
    got = {r.request.row: r.token_ids for d in done for r in d.results}
    same = sum(want[row] == got[row] for row in want)
    print(f"mixed-K rows identical to K=0: {same}/{len(want)}")


if __name__ == "__main__":
    main()
