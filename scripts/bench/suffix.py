"""Suffix drafts (``method: suffix`` on the tree engine) against n-gram trees, replayed offline
on a job's committed rows (``tree_lib.Tally``: exact for greedy rows, no model runs): tokens per
target forward, the index's state per million output tokens, the time a draft takes. Three
orders feed the domain's earlier outputs to the index:

- ``sequential``: each domain's rows in input order, each drafting from the rows before it
  (what a batch-1 engine gives a row: the rows that finished before it began);
- ``batch 16``: the same, but a row does not see the 15 rows before it (in flight beside it in
  a batch of 16), which the K controller's after-the-fact replay does see: how far that is off;
- ``held-out``: the held-out rows (``--holdout``, by row id as ``distill`` splits) drafting from
  every other row of their domain (the steady state, once the index holds a domain).

    .venv/bin/batchspec run jobs/synth_tree.yaml --output /tmp/sfx/out
    .venv/bin/python scripts/bench/suffix.py --output /tmp/sfx/out

The last line: ``suffix: X tokens per target forward at K=4 (n-gram trees Y), Z at K=8 (W)``.
"""

from __future__ import annotations

import tracemalloc

from harness import JOBS, ints, parser
from tree_lib import Tally, committed

from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.suffix import SuffixDrafter
from batchspec.engines.tree.suffix_index import SuffixIndex

ORDERS = {"sequential": 0, "batch 16": 15, "held-out": None}
"""How many rows before it a row does not see (the rows in flight beside it); None: every row
but the held-out ones is indexed first and only those are counted."""


def run_order(rows: list, held: set, k: int, shape, lookup, lag: int | None) -> Tally:
    """Every counted row replayed with n-gram trees and with suffix trees, the index fed as
    ``lag`` says (``ORDERS``)."""
    tally, suffix = Tally(), SuffixDrafter(NgramDrafter(*lookup))
    for r in rows if lag is None else []:
        if r.row_id not in held:
            suffix.learn(r.domain, r.output)
    pending: list = []
    for r in rows:
        if lag is None and r.row_id not in held:
            continue
        tally.add("ngram", NgramDrafter(*lookup), r, k, shape)
        tally.add("suffix", suffix, r, k, shape)
        pending.append(r)
        while lag is not None and len(pending) > lag:
            done = pending.pop(0)
            suffix.learn(done.domain, done.output)
    return tally


def state_per_million(rows: list) -> tuple[float, float]:
    """MB of index state once one million output tokens, then five, went through a 1M-token
    index: the job's outputs fed round and round, measured by tracemalloc."""
    tracemalloc.start()
    base, index, got = tracemalloc.get_traced_memory()[0], SuffixIndex(1 << 20), []
    for goal in (1_000_000, 5_000_000):
        while index.total < goal:
            for r in rows:
                index.add(r.output)
        got.append((tracemalloc.get_traced_memory()[0] - base) / 1e6)
    tracemalloc.stop()
    return got[0], got[1]


def main() -> None:
    # --holdout: the held-out share, by row id; --ks: the node budgets replayed.
    ap = parser(__doc__, job=str(JOBS / "synth_tree.yaml"), holdout=0.1, ks="4,8")
    ap.add_argument("--output", required=True, help="the job's output directory")
    a = ap.parse_args()
    spec, rows, held_rows = committed(a.job, a.output, a.holdout)
    rows.sort(key=lambda r: (str(r.domain), str(r.row_id)))
    held = {r.row_id for r in held_rows}
    s = spec.speculative
    lookup = (s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
    domains = sorted({str(r.domain) for r in rows})
    print(f"{len(rows)} rows ({len(held)} held out), {len(domains)} domains, lookup {lookup}")
    last = {}
    for k in ints(a.ks):
        for order, lag in ORDERS.items():
            tally = run_order(rows, held, k, s.tree, lookup, lag)
            print(f"\nK={k}, {order}: tokens per target forward (every step)")
            print(f"{'domain':<15} {'ngram':>7} {'suffix':>7} {'gain':>6}")
            for dom in [*domains, "all"]:
                n, x = tally.per_forward(dom, "ngram"), tally.per_forward(dom, "suffix")
                print(f"{dom:<15} {n:7.2f} {x:7.2f} {x / n:6.3f}")
            print(f"suffix drafting: {tally.ms_per_forward('suffix'):.2f} ms per step on average")
            if order == "sequential":
                last[k] = (tally.per_forward("all", "suffix"), tally.per_forward("all", "ngram"))
    one, five = state_per_million(rows)
    print(f"\nindex state: {one:.1f} MB after 1M output tokens, {five:.1f} MB after 5M (cap 1M)")
    parts = [f"{x:.2f} at K={k} (n-gram trees {n:.2f})" for k, (x, n) in last.items()]
    print("suffix: " + ", ".join(parts) + " tokens per target forward")


if __name__ == "__main__":
    main()
