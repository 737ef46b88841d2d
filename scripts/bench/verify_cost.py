"""What a verify of N nodes costs against a plain step at batch 1, and what n-gram drafting adds
(issue 35, T1: a verify of <= 8 nodes within 1.15x a plain step; drafting <= 10 %). The target
as a batch-1 engine builds it, a plain step and a verify of N nodes in ABBA rounds in one
process (N = 1: the measurement's own noise); then n-gram drafting over long-context rows.

    .venv/bin/python scripts/bench/verify_cost.py --threads 1 --rounds 2 --reps 5

The last line: ``verify/plain step W at 8 nodes``.
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch: see engines/tree/model.py

import torch
from harness import ROOT, abba, header, ints, options, parser, ratio, step_ms

from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.models import embedded_dir, load_tokenizer

MODEL = "smollm2-135m-instruct"
LONG_SET = ROOT / "jobs" / "data" / "prompts_long.parquet"


def verify_costs(model: TreeModel, nodes: list[int], rounds: int, reps: int) -> dict:
    """Plain-step and verify ms (median of ``reps``) per node count, ABBA; where the C forward
    is built (``engines/tree/fewrows.py``), the verify by the eager layers too (the small-row
    kernel's products, the ops between them as PyTorch ops)."""
    few = model.few_rows
    configs = ["plain", "verify"] + (["verify eager"] if few is not None else [])
    out = {}
    for n in nodes:

        def run(config: str, _round: int, n: int = n) -> float:
            model.few_rows = None if config == "verify eager" else few
            return step_ms(model, 1, 1 if config == "plain" else n, reps, statistics.median)

        out[n] = got = abba(configs, rounds, run, lambda _c, ms: f"{ms:.1f} ms")
        line = f"N={n:>2}: verify/plain {ratio(got['verify'], got['plain'])}"
        if "verify eager" in got:
            line += f", by the eager layers {ratio(got['verify eager'], got['plain'])}"
        print(line, flush=True)
    model.few_rows = few
    return out


def drafting_seconds(k: int, rows: int, steps: int) -> float:
    """Seconds per step of n-gram drafting (``draft`` of a tree of ``k`` nodes, depth 4, and
    ``extend`` by two tokens) over the first ``rows`` prompts of the long-context set."""
    import polars as pl

    tokenizer = load_tokenizer(embedded_dir(MODEL), "model.tokenizer")
    prompts = pl.read_parquet(LONG_SET)["prompt"].head(rows).to_list()
    drafter, spent, count = NgramDrafter(1, 3), 0.0, 0
    for slot, text in enumerate(prompts):
        ids = tokenizer(text)["input_ids"]
        cut = max(1, len(ids) - 2 * steps)
        drafter.start(slot, ids[:cut])
        for at in range(cut, len(ids) - 1, 2):
            started = time.perf_counter()
            drafter.draft([Ask(slot, k, 4)])
            drafter.extend(slot, ids[at : at + 2])
            spent += time.perf_counter() - started
            count += 1
        drafter.release(slot)
    return spent / max(count, 1)


def main() -> None:
    # --nodes: node counts N; --context: cached tokens before a step; --rounds: ABBA rounds per
    # N; --reps: forwards per measurement; --k, --rows: draft nodes and long-context rows of
    # the drafting share; --threads: torch's (0: one per core).
    ap = parser(__doc__, nodes="1,2,4,8,16", context=256, rounds=2, reps=5, k=8, rows=8)
    args = options(ap, threads=0).parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    header()
    model = TreeModel.load(embedded_dir(MODEL), torch.float32, "cpu", 1, args.context + 64)
    compiled = model.use_one_row_kernel()
    how = "in C" if model.few_rows is not None else "compiled" if compiled else "eager"
    print(f"threads {torch.get_num_threads()}, plain steps {how}", flush=True)
    model.prefill(0, [(7 * i) % 30000 + 10 for i in range(args.context)])
    nodes = ints(args.nodes)
    costs = verify_costs(model, nodes, args.rounds, args.reps)
    plain = statistics.fmean(s for got in costs.values() for s in got["plain"])
    draft = drafting_seconds(args.k, args.rows, steps=32) * 1e3
    print(
        f"n-gram drafting, K={args.k}: {draft:.2f} ms a step, "
        f"{draft / plain:.1%} of a plain step ({plain:.1f} ms)"
    )
    if 8 in costs:
        print(f"verify/plain step {ratio(costs[8]['verify'], costs[8]['plain'])} at 8 nodes")


if __name__ == "__main__":
    main()
