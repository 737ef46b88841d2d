"""What a verify step costs, in ABBA rounds in one process.

At batch 1 (issue 35, T1: a verify of <= 8 nodes within 1.15x a plain step; drafting <= 10 %):
the target as a batch-1 engine builds it, a plain step against a verify of N nodes (N = 1: the
measurement's own noise); then n-gram drafting over long-context rows. The last line:
``verify/plain step W at 8 nodes``.

    .venv/bin/python scripts/bench/verify_cost.py --threads 1 --rounds 2 --reps 5

``--mixed``: a batch-8 step whose rows differ (units at different K, sparse model-free trees,
different contexts), packed as the engine runs it, with attention cut into runs of rows
(``engines/tree/attention.py``) against one call over the padded batch. The last line:
``runs/one call: X on the mixed cases, Y on the uniform ones``.

    .venv/bin/python scripts/bench/verify_cost.py --mixed --threads 1 --rounds 2 --reps 10
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch: see engines/tree/model.py

import torch
from harness import ROOT, abba, header, ints, options, parser, ratio, step_ms

from batchspec.engines.tree import attention
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.models import embedded_dir, load_tokenizer

MODEL = "smollm2-135m-instruct"
LONG_SET = ROOT / "jobs" / "data" / "prompts_long.parquet"
CASES = {  # --mixed; name: (each row's tree nodes, each row's cached tokens)
    "plain, equal contexts": ([1] * 8, [400] * 8),
    "one row at K=4": ([5] + [1] * 7, [400] * 8),
    "sparse trees": ([3, 1, 2, 1, 5, 1, 1, 2], [400] * 8),
    "all at K=4": ([5] * 8, [400] * 8),
    "plain, 100 and 800 cached": ([1] * 8, [100, 800] * 4),
    "one row at K=4, 100 and 800": ([5] + [1] * 7, [100, 800] * 4),
    "sparse trees, 250-500 cached": ([3, 1, 2, 1, 5, 1, 1, 2], [300, 420, 250, 500] * 2),
}
UNIFORM = {"plain, equal contexts", "all at K=4"}


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


def one_call(base: list[int], sizes: list[int]) -> list[tuple[int, int, int, int]]:
    """Attention as it ran before runs: every row in one call, at the widest tree and the
    longest context."""
    return [(0, len(base), max(sizes), max(base) + max(sizes))]


def mixed(rounds: int, reps: int) -> None:
    """``--mixed``: each case's step with attention in runs against one call, ABBA."""
    model = TreeModel.load(embedded_dir(MODEL), torch.float32, "cpu", 8, 1024)
    runs = attention.partition
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for name, (sizes, contexts) in CASES.items():
        for slot, n in enumerate(contexts):
            model.prefill(slot, [(7 * i + slot) % 30000 + 10 for i in range(n)])

        def run(config: str, _round: int, sizes: list[int] = sizes) -> float:
            attention.partition = runs if config == "runs" else one_call
            return step_ms(model, len(sizes), max(sizes), reps, statistics.median, sizes)

        got = abba(["one call", "runs"], rounds, run, lambda _c, ms: f"{ms:.1f} ms")
        cut = [r[:2] for r in runs(contexts, sizes)]
        print(f"{name}: runs/one call {ratio(got['runs'], got['one call'])}, runs {cut}")
        mean = {c: statistics.fmean(ms) for c, ms in got.items()}
        ratios[name in UNIFORM].append(mean["runs"] / mean["one call"])
    attention.partition = runs
    cases, uniform = (statistics.geometric_mean(ratios[u]) for u in (False, True))
    print(f"runs/one call: {cases:.3f} on the mixed cases, {uniform:.3f} on the uniform ones")


def main() -> None:
    # --nodes: node counts N; --context: cached tokens before a step; --rounds: ABBA rounds per
    # N or case; --reps: forwards per measurement; --k, --rows: draft nodes and long-context
    # rows of the drafting share; --threads: torch's (0: one per core).
    ap = parser(__doc__, nodes="1,2,4,8,16", context=256, rounds=2, reps=5, k=8, rows=8)
    args = options(ap, threads=0, mixed=False).parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    header()
    if args.mixed:
        return mixed(args.rounds, args.reps)
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
