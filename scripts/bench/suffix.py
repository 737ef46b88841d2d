"""Suffix drafts (``method: suffix`` on the tree engine) against n-gram trees, replayed offline
on a job's committed rows: tokens per target forward, the index's state per million output
tokens, and the time a draft takes.

Replay is exact for greedy rows (the target's choices are the row's own tokens; see
``engines/tree/drafting.py``), so no model runs. Two orders for the domain's earlier outputs:

- ``sequential``: each domain's rows in input order, each drafting from the rows before it
  (what a batch-1 engine gives a row: the rows that finished before it began);
- ``batch 16``: the same, but a row does not see the 15 rows before it (in flight beside it
  in a batch of 16), which the K controller's replay does see (it learns each row after
  replaying it): how far that after-the-fact replay is off;
- ``held-out``: the held-out rows (``--holdout``, by row id as ``distill`` splits) drafting
  from every other row of their domain (the steady state, once the index holds a domain).

    .venv/bin/batchspec run jobs/synth_tree.yaml --output /tmp/sfx/out
    .venv/bin/python scripts/bench/suffix.py --output /tmp/sfx/out

The last line: ``suffix: X tokens per target forward at K=4 (n-gram trees Y), Z at K=8 (W)``.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[2]

from batchspec.engines.tree.drafting import Drafter, replay  # noqa: E402
from batchspec.engines.tree.ngram import NgramDrafter  # noqa: E402
from batchspec.engines.tree.suffix import SuffixDrafter  # noqa: E402
from batchspec.engines.tree.suffix_index import SuffixIndex  # noqa: E402
from batchspec.io.layout import OutDir  # noqa: E402
from batchspec.measure.distill import split  # noqa: E402
from batchspec.measure.distill_data import Row, committed_rows  # noqa: E402
from batchspec.spec.file import load_spec  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    ap.add_argument("--output", required=True, help="the job's output directory")
    ap.add_argument("--holdout", type=float, default=0.1, help="held-out share, by row id")
    ap.add_argument("--ks", default="4,8", help="node budgets replayed")
    return ap.parse_args()


class Tally:
    """Per domain and drafter: output tokens after the first, target forwards, draft seconds."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, str], list[float]] = {}
        self.slowest = 0.0

    def add(self, dom: str, name: str, drafter: Drafter, r: Row, k: int, shape) -> None:
        started = time.perf_counter()
        got = replay(drafter, r.prompt, r.output, k, shape, len(r.output) + 1, domain=r.domain)
        took = time.perf_counter() - started
        forwards = len(r.output) - 1 - sum(got.accepted)  # each step emits accepted + 1
        for key in ((dom, name), ("mean", name)):
            s = self.sums.setdefault(key, [0, 0, 0.0, 0])
            s[0] += len(r.output) - 1
            s[1] += forwards
            s[2] += took
            s[3] += max(forwards, 1)
        self.slowest = max(self.slowest, took / max(forwards, 1))

    def rate(self, dom: str, name: str) -> float:
        s = self.sums.get((dom, name))
        return s[0] / s[1] if s and s[1] else float("nan")


ORDERS = {"sequential": 0, "batch 16": 15, "held-out": None}
"""How many rows before it a row does not see (the rows in flight beside it); None: every row
but the held-out ones is indexed first and only those are counted."""


def run_order(rows: list[Row], held: set, k: int, shape, lookup, lag: int | None) -> Tally:
    """Replay every counted row with n-gram trees and with suffix trees, the index fed as
    ``lag`` says (``ORDERS``)."""
    tally = Tally()
    suffix = SuffixDrafter(NgramDrafter(*lookup))
    if lag is None:
        for r in rows:
            if r.row_id not in held:
                suffix.learn(r.domain, r.output)
    pending: list[Row] = []
    for r in rows:
        if lag is None and r.row_id not in held:
            continue
        dom = str(r.domain)
        tally.add(dom, "ngram", NgramDrafter(*lookup), r, k, shape)
        tally.add(dom, "suffix", suffix, r, k, shape)
        if lag is not None:
            pending.append(r)
            while len(pending) > lag:
                done = pending.pop(0)
                suffix.learn(done.domain, done.output)
    return tally


def state_per_million(rows: list[Row]) -> tuple[float, float]:
    """(MB of index state once a million output tokens went through a 1M-token index, the same
    after five million): the job's outputs fed round and round, measured by tracemalloc."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = SuffixIndex(1 << 20)
    got = []
    for goal in (1_000_000, 5_000_000):
        while index.total < goal:
            for r in rows:
                index.add(r.output)
        got.append((tracemalloc.get_traced_memory()[0] - base) / 1e6)
    tracemalloc.stop()
    return got[0], got[1]


def main() -> None:
    a = parse()
    spec = load_spec(Path(a.job), [f"output.dir={a.output}"])
    rows, _ = committed_rows(spec, OutDir(Path(a.output)), None)
    rows.sort(key=lambda r: (str(r.domain), str(r.row_id)))
    _, held_rows = split(rows, a.holdout)
    held = {r.row_id for r in held_rows}
    s = spec.speculative
    lookup = (s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
    shape = s.tree
    domains = sorted({str(r.domain) for r in rows})
    print(f"{len(rows)} rows ({len(held)} held out), {len(domains)} domains, lookup {lookup}")
    last = {}
    for k in [int(x) for x in a.ks.split(",")]:
        for order, lag in ORDERS.items():
            tally = run_order(rows, held, k, shape, lookup, lag)
            print(f"\nK={k}, {order}: tokens per target forward (every step)")
            print(f"{'domain':<15} {'ngram':>7} {'suffix':>7} {'gain':>6}")
            for dom in [*domains, "mean"]:
                n, x = tally.rate(dom, "ngram"), tally.rate(dom, "suffix")
                print(f"{dom:<15} {n:7.2f} {x:7.2f} {x / n:6.3f}")
            t = tally.sums[("mean", "suffix")]
            print(f"suffix drafting: {1e3 * t[2] / t[3]:.2f} ms per step on average")
            if order == "sequential":
                last[k] = (tally.rate("mean", "suffix"), tally.rate("mean", "ngram"))
    one, five = state_per_million(rows)
    print(f"\nindex state: {one:.1f} MB after 1M output tokens, {five:.1f} MB after 5M (cap 1M)")
    parts = [f"{x:.2f} at K={k} (n-gram trees {n:.2f})" for k, (x, n) in last.items()]
    print("suffix: " + ", ".join(parts) + " tokens per target forward")


if __name__ == "__main__":
    main()
