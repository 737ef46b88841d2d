"""What a verify step of a batch whose rows differ costs with attention cut into runs of rows
(``engines/tree/attention.py``) against one call over the padded batch: rows of different
tree sizes (units at different K, sparse model-free trees) and different contexts, through
the real verify forward of the embedded model, packed as the engine runs it. ABBA rounds of
the two in one process; each case's ratio with its spread.

    .venv/bin/python scripts/bench/mixed_batch.py --threads 1 --rounds 2

The last line: ``runs/one call: X on the mixed cases, Y on the uniform ones``.
"""

from __future__ import annotations

import os
import statistics

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch: see engines/tree/model.py

import torch
from harness import abba, header, options, parser, ratio, step_ms

from batchspec.engines.tree import attention
from batchspec.engines.tree.model import TreeModel
from batchspec.models import embedded_dir

MODEL = "smollm2-135m-instruct"
CASES = {  # name: (each row's tree nodes, each row's cached tokens)
    "plain, equal contexts": ([1] * 8, [400] * 8),
    "one row at K=4": ([5] + [1] * 7, [400] * 8),
    "sparse trees": ([3, 1, 2, 1, 5, 1, 1, 2], [400] * 8),
    "all at K=4": ([5] * 8, [400] * 8),
    "plain, 100 and 800 cached": ([1] * 8, [100, 800] * 4),
    "one row at K=4, 100 and 800": ([5] + [1] * 7, [100, 800] * 4),
    "sparse trees, 250-500 cached": ([3, 1, 2, 1, 5, 1, 1, 2], [300, 420, 250, 500] * 2),
}
UNIFORM = {"plain, equal contexts", "all at K=4"}


def one_call(base: list[int], sizes: list[int]) -> list[tuple[int, int, int, int]]:
    """Attention as it ran before runs: every row in one call, at the widest tree and the
    longest context."""
    return [(0, len(base), max(sizes), max(base) + max(sizes))]


def prefilled(model: TreeModel, contexts: list[int]) -> TreeModel:
    """``model`` with row b's slot holding ``contexts[b]`` synthetic cached tokens."""
    for slot, n in enumerate(contexts):
        model.prefill(slot, [(7 * i + slot) % 30000 + 10 for i in range(n)])
    return model


def main() -> None:
    # --rounds: ABBA rounds per case; --reps: steps per measurement; --threads: torch's.
    args = options(parser(__doc__, rounds=2, reps=10), threads=1).parse_args()
    torch.set_num_threads(args.threads)
    header()
    model = TreeModel.load(embedded_dir(MODEL), torch.float32, "cpu", 8, 1024)
    runs = attention.partition
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for name, (sizes, contexts) in CASES.items():

        def run(config: str, _round: int, sizes=sizes, contexts=contexts) -> float:
            attention.partition = runs if config == "runs" else one_call
            b, n = len(sizes), max(sizes)
            return step_ms(prefilled(model, contexts), b, n, args.reps, statistics.median, sizes)

        got = abba(["one call", "runs"], args.rounds, run, lambda _c, ms: f"{ms:.1f} ms")
        cut = [r[:2] for r in runs(contexts, sizes)]
        print(f"{name}: runs/one call {ratio(got['runs'], got['one call'])}, runs {cut}")
        mean = {c: statistics.fmean(ms) for c, ms in got.items()}
        ratios[name in UNIFORM].append(mean["runs"] / mean["one call"])
    attention.partition = runs
    mixed, uniform = (statistics.geometric_mean(ratios[u]) for u in (False, True))
    print(f"runs/one call: {mixed:.3f} on the mixed cases, {uniform:.3f} on the uniform ones")


if __name__ == "__main__":
    main()
