"""Step cost of the tree engine's target model (issue 13, T4): plain decoding against the
memory bound, and verify time against tree nodes and batch size. Decoding at batch 1 reads
every weight once, so its bound is memory bandwidth / weight bytes: printed as gpt-fast's
"bandwidth achieved" against this machine's copy bandwidth (and read bandwidth), sampled
between decode rounds; then a table of one verify forward of B rows x N nodes.

    .venv/bin/python scripts/bench/tree_decode.py                  # embedded model, float32, CPU
    .venv/bin/python scripts/bench/tree_decode.py --mkl            # eager, MKL's kernel
    python scripts/bench/tree_decode.py --device cuda --dtype bfloat16 --random-7b

``--random-7b``: random weights of a Llama-2-7B shape (step cost does not depend on values).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Read when torch loads, so set before it is imported. Transparent huge pages for torch's
# large CPU allocations: fewer TLB misses while streaming the weights, decode ~7% faster here.
# OpenMP's wait policy is left as it is: spinning a while (libgomp's default) suits the
# compiled one-row regions, whose threads wake ~60 times a step; OMP_WAIT_POLICY=PASSIVE made
# them 1.5x slower on a quiet machine (25.5 against ~38 steps/s), and only pays where another
# process shares the cores (spinning threads made steps 5-6x slower there).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import options, parser

from batchspec.engines.tree.model import TreeModel
from batchspec.models import embedded_dir

LLAMA2_7B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
PARAMS_7B = 6_738_415_616
ROUNDS = 4
"""Decode rounds, each after a copy-bandwidth sample (the first round, warm-up, not timed)."""


def parse() -> argparse.Namespace:
    """--random-7b: random Llama-2-7B-shaped weights; --steps: timed decode steps; --context:
    prompt tokens cached per row; --reps: timed verify forwards per cell; --mkl: eager one-row
    steps on MKL's kernel, not the compiled regions."""
    ap = parser(__doc__, random_7b=False, threads=len(os.sched_getaffinity(0)), steps=64, warmup=8)
    options(ap, context=128, nodes="1,2,4,8,16,32", batches="1,8,16", reps=3, mkl=False)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return ap.parse_args()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class CopyMeter:
    """Copy bandwidth of a large tensor copy in GB/s, counting read + write bytes (as STREAM
    does), sampled between decode rounds so that both see the same machine load."""

    def __init__(self, device: str) -> None:
        n = (1 << 30 if device == "cuda" else 1 << 28) // 4
        self.device = device
        self.src = torch.rand(n, device=device)
        self.dst = torch.empty_like(self.src)

    def sample(self) -> tuple[float, float]:
        """(copy, read) GB/s, each the best of three, on all the cores this process may use
        (the machine's bandwidth, whatever ``--threads`` the model runs with). Copy counts
        read + write bytes; read is a sum over the same tensor (a read-only stream, like a
        decode step's weights)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        nbytes = self.src.numel() * 4
        copy = 2 * nbytes / self._best(lambda: self.dst.copy_(self.src)) / 1e9
        read = nbytes / self._best(self.src.sum) / 1e9
        torch.set_num_threads(threads)
        return copy, read

    def _best(self, fn: Callable[[], object]) -> float:
        best = float("inf")
        for _ in range(3):
            sync(self.device)
            t = time.perf_counter()
            fn()
            sync(self.device)
            best = min(best, time.perf_counter() - t)
        return best


def enough_memory(args: argparse.Namespace, dtype: torch.dtype) -> str | None:
    """Why a random 7B model cannot be built here, or None if it fits."""
    copies = 2.2 if args.device == "cpu" else 1.2  # on the CPU, plain + packed matrices
    need = PARAMS_7B * torch.empty(0, dtype=dtype).element_size() * copies
    if args.device == "cuda":
        have = torch.cuda.mem_get_info()[0]
    else:
        meminfo = Path("/proc/meminfo").read_text().split("\n")
        have = next(int(x.split()[1]) * 1024 for x in meminfo if x.startswith("MemAvailable"))
    if have < need:
        return f"needs ~{need / 1e9:.0f} GB, {have / 1e9:.0f} GB available"
    return None


def build(args: argparse.Namespace, dtype: torch.dtype, max_batch: int, max_len: int) -> TreeModel:
    if args.random_7b:
        return TreeModel.random(LLAMA2_7B, dtype, args.device, max_batch, max_len)
    return TreeModel.load(
        embedded_dir("smollm2-135m-instruct"), dtype, args.device, max_batch, max_len
    )


def decode_rounds(model: TreeModel, args: argparse.Namespace, meter: CopyMeter) -> list[tuple]:
    """Greedy decode at batch 1 (verify one node, keep it, take the argmax) in ROUNDS rounds,
    a bandwidth sample before each: [((copy, read) GB/s, steps, seconds)] per round."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, model.vocab_size, (args.context,), generator=gen).tolist()
    token = int(model.prefill(0, prompt).argmax())
    one = torch.ones(1, 1, 1, dtype=torch.bool)
    rounds = []
    for r in range(ROUNDS + 1):
        steps = args.warmup if r == 0 else max(1, args.steps // ROUNDS)
        bandwidth = meter.sample()
        sync(args.device)
        t = time.perf_counter()
        for _ in range(steps):
            pos = torch.tensor([[model.cache_len[0]]])
            logits = model.verify([0], torch.tensor([[token]]), pos, one)
            model.commit(0, [0])
            token = int(logits[0, 0].argmax())
        if r > 0:
            rounds.append((bandwidth, steps, time.perf_counter() - t))
    model.release(0)
    return rounds


def verify_ms(model: TreeModel, args: argparse.Namespace, batch: int, nodes: int) -> float:
    """Milliseconds of one verify forward of ``batch`` rows x ``nodes`` nodes (best of reps).
    Rows hold different prefix lengths; the mask is a chain (cost does not depend on it)."""
    slots = list(range(batch))
    positions = torch.tensor([model.cache_len[s] for s in slots]).unsqueeze(1) + torch.arange(nodes)
    mask = torch.ones(nodes, nodes, dtype=torch.bool).tril().expand(batch, nodes, nodes)
    tokens = torch.randint(100, model.vocab_size, (batch, nodes))
    best = float("inf")
    for _ in range(args.reps + 1):
        sync(args.device)
        t = time.perf_counter()
        model.verify(slots, tokens, positions, mask)
        sync(args.device)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def report_decode(model: TreeModel, rounds: list[tuple], context: int) -> None:
    for i, ((copy, read), steps, secs) in enumerate(rounds, 1):
        print(
            f"  round {i}: copy {copy:.1f} GB/s, read {read:.1f} GB/s, {steps / secs:.1f} steps/s"
        )
    copy = statistics.median(r[0][0] for r in rounds)
    read = statistics.median(r[0][1] for r in rounds)
    rate = sum(r[1] for r in rounds) / sum(r[2] for r in rounds)
    achieved = model.weight_bytes * rate / 1e9
    print(
        f"plain decode, batch 1, context {context}: {rate:.1f} steps/s "
        f"({1e3 / rate:.1f} ms/step); bound {copy * 1e9 / model.weight_bytes:.1f} steps/s"
    )
    print(
        f"bandwidth achieved: {achieved:.1f} GB/s (weight bytes x steps/s) = "
        f"{100 * achieved / copy:.0f}% of measured copy bandwidth {copy:.1f} GB/s "
        f"({100 * achieved / read:.0f}% of read bandwidth {read:.1f} GB/s; medians of the rounds)"
    )


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    nodes = [int(x) for x in args.nodes.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}, {args.threads} threads, {args.device}, {args.dtype}")
    if args.device == "cpu" and load > len(os.sched_getaffinity(0)):
        print("  the machine is busy: figures are low, and threads may wait on each other")
    if args.random_7b and (why := enough_memory(args, dtype)):
        print(f"--random-7b skipped: {why}")
        return
    meter = CopyMeter(args.device)
    max_len = args.context + 2 * max(batches) + max(nodes) + args.warmup + args.steps + 8
    t = time.perf_counter()
    model = build(args, dtype, max(batches), max_len)
    # As a batch-1 engine does (TreeEngine): one-row products by inductor's kernel.
    kernel = not args.mkl and model.use_one_row_kernel()
    name = "random Llama-2-7B shape" if args.random_7b else "SmolLM2-135M"
    mb, took = model.weight_bytes / 1e6, time.perf_counter() - t
    print(
        f"model: {name}, weights read per step {mb:.0f} MB, built in {took:.1f} s; one-row "
        f"steps {'compiled (onerow.py)' if kernel else 'eager on MKL'}"
    )
    report_decode(model, decode_rounds(model, args, meter), args.context)
    gen = torch.Generator().manual_seed(1)
    for slot in range(max(batches)):
        length = args.context + 2 * slot
        model.prefill(slot, torch.randint(100, model.vocab_size, (length,), generator=gen).tolist())
    longest = args.context + 2 * max(batches) - 2
    print(f"\nverify forward, ms per step (rows hold {args.context}..{longest} cached tokens)")
    print("| B \\ N | " + " | ".join(str(n) for n in nodes) + " |")
    print("|---" * (len(nodes) + 1) + "|")
    for b in batches:
        cells = [f"{verify_ms(model, args, b, n):.1f}" for n in nodes]
        print(f"| {b} | " + " | ".join(cells) + " |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
