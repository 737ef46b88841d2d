"""CUDA graphs of the tree engine on a GPU (issue 35, target T4), in one short device call.

On a GPU the engine's verify forwards (a plain decode step is a verify of one node) replay
CUDA graphs captured per (batch, nodes, span) bucket (``batchspec/engines/tree/graphs.py``).
This check:

- times plain decode steps at batch 1 and 8 and verifies of 1 x 4, 8, 16 nodes and 8 x 16 on
  a random-weight Llama-2-7B shape in bfloat16, eager against graphs in ABBA rounds (a step:
  the forward, an argmax and its host sync), and prints gpt-fast's "Bandwidth achieved"
  (bytes of weights and KV read per step / step time) beside the copy bandwidth measured in
  the same run (a 1 GiB device-to-device copy, read + write bytes, as STREAM counts);
- runs the tree engine greedily at batch 1 and 8 (a random SmolLM2-135M shape in float32,
  logits sharpened as in device_tree.py): K=4 n-gram trees and K=0, both on graphs, token
  for token, and K=0 on graphs against K=0 eager.

Its last line is T4's; the transcript goes to ``--out``. With ``--device cpu`` it runs tiny
shapes through the padded forward uncaptured, in seconds (the suite runs it so).

    python3 scripts/checks/device_graphs.py --out $OUT            # on the GPU (docs/trees.md)
    .venv/bin/python scripts/checks/device_graphs.py --device cpu  # here
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from batchspec.engines.base import ListSource
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.graphs import CudaGraphs
from batchspec.engines.tree.load import Target
from batchspec.engines.tree.model import TreeModel
from batchspec.spec import JobSpec
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

LLAMA2_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}  # fmt: skip
SMOL = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rope_theta": 100000.0,
        "tie_word_embeddings": True}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
        "max_position_embeddings": 1024}  # fmt: skip
CELLS = [(1, 1), (8, 1), (1, 4), (1, 8), (1, 16), (8, 16)]
"""(rows, nodes) timed: one node is a plain decode step."""
CONTEXT, PEAK = 256, 12.0


class Say:
    """Prints a line and appends it to the transcript (``--out``) as it goes, so a run cut
    short leaves what it measured."""

    def __init__(self, out: Path | None) -> None:
        self.path = out / "device_graphs.txt" if out is not None else None
        if self.path is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")


def copy_bandwidth(device: str) -> float:
    """GB/s of a large device-to-device copy, read + write bytes, best of 5."""
    src = torch.rand((1 << 28) if device == "cuda" else (1 << 22), device=device)
    dst, best = torch.empty_like(src), float("inf")
    for _ in range(5):
        sync(device)
        started = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - started)
    return 2 * src.numel() * 4 / best / 1e9


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_ms(model: TreeModel, rows: int, nodes: int, reps: int) -> float:
    """Mean ms of a step of ``rows`` x ``nodes`` (a chain; cost does not depend on the
    shape), after warm-ups that capture the step's graph."""
    slots = list(range(rows))
    pos = torch.tensor([model.cache_len[s] for s in slots]).unsqueeze(1) + torch.arange(nodes)
    mask = torch.ones(nodes, nodes, dtype=torch.bool).tril().expand(rows, nodes, nodes)
    tokens = torch.randint(100, model.vocab_size, (rows, nodes))
    for _ in range(3):
        model.verify(slots, tokens, pos, mask)[0, 0].argmax().item()
    sync(str(model.device))
    started = time.perf_counter()
    for _ in range(reps):
        model.verify(slots, tokens, pos, mask)[0, 0].argmax().item()
    return (time.perf_counter() - started) / reps * 1e3


def device_ops(model: TreeModel, graphs: CudaGraphs | None) -> str:
    """What the GPU runs for one plain batch-1 step (kernels, copies; torch.profiler): the
    launches a graph does not remove are its floor."""
    from torch.profiler import ProfilerActivity, profile

    model.graphs = graphs
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step_ms(model, 1, 1, 1)
    except Exception as exc:  # no CUPTI: the timings stand without it
        return f"n/a ({exc!r})"
    cuda = torch.autograd.DeviceType.CUDA
    return str(sum(e.device_type == cuda for e in prof.events()) // 4)  # step_ms ran 4


def fused_norm_trial(
    model: TreeModel, reps: int, share: Callable[[float], float], say: Say
) -> None:
    """An experiment, not the engine's path: RMSNorm (eight kernels in bf16, 65 of them a
    step) compiled by inductor into one kernel, in graphs captured afresh; says how much of
    what graphs leave is the small ops between the matrix products."""
    from batchspec.engines.tree import model as module

    eager_norm, cells = module.rms_norm, ((1, 1), (1, 16))
    what = "RMSNorm compiled (inductor) inside graphs, an experiment"
    try:
        module.rms_norm = torch.compile(eager_norm, dynamic=False)
        model.graphs = None
        for cell in cells:  # compiled eagerly first: nothing compiles inside a capture
            step_ms(model, *cell, 1)
        model.graphs = trial = CudaGraphs(model)
        ms = {cell: step_ms(model, *cell, reps) for cell in cells}
        say(f"{what}: plain decode {ms[(1, 1)]:.2f} ms/step = {share(ms[(1, 1)]):.0f}% of copy, "
            f"verify 1 x 16 {ms[(1, 16)]:.2f} ms/step; GPU operations per plain step "
            f"{device_ops(model, trial)}")  # fmt: skip
    except Exception as exc:  # an experiment: the check stands without it
        say(f"{what}: n/a ({exc!r})")
    finally:
        module.rms_norm = eager_norm


def speed(args: argparse.Namespace, say: Say) -> tuple[float, float]:
    """Every cell eager and on graphs (ABBA); (plain batch-1 share of copy bandwidth,
    verify 1x16 / plain batch 1), both on graphs."""
    cfg, dtype = (LLAMA2_7B, torch.bfloat16) if args.device == "cuda" else (TINY, torch.float32)
    model = TreeModel.random(cfg, dtype, args.device, 8, CONTEXT + 64)
    model.prefill(0, torch.randint(100, model.vocab_size, (CONTEXT,)).tolist())
    for slot in range(1, 8):
        model.share_prefix(0, slot, CONTEXT)
    graphs = CudaGraphs(model, capture=args.device == "cuda")
    copy = copy_bandwidth(args.device)
    c = model.cfg
    kv_pos = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * dtype.itemsize
    shape = "Llama-2-7B" if args.device == "cuda" else "tiny"
    say(f"model: random {shape} shape, {dtype}, weights read per step "
        f"{model.weight_bytes / 1e6:,.0f} MB, {CONTEXT} tokens cached per row; copy "
        f"bandwidth {copy:,.0f} GB/s (1 GiB device-to-device, read + write)")  # fmt: skip
    runs: dict[str, dict[tuple[int, int], list[float]]] = {"eager": {}, "graphs": {}}
    for mode in ("eager", "graphs", "graphs", "eager"):
        model.graphs = graphs if mode == "graphs" else None
        for cell in CELLS:
            runs[mode].setdefault(cell, []).append(step_ms(model, *cell, args.reps))
    for rows, nodes in CELLS:
        read = model.weight_bytes + rows * (CONTEXT + nodes) * kv_pos
        what = f"plain decode, batch {rows}" if nodes == 1 else f"verify {rows} x {nodes} nodes"
        for mode in ("eager", "graphs"):
            ms = statistics.fmean(runs[mode][(rows, nodes)])
            gbs = read / ms / 1e6
            say(f"{what:>24} {mode:>6}: {ms:6.2f} ms/step ({1e3 / ms:6.1f} steps/s), Bandwidth "
                f"achieved: {gbs:,.2f} GB/s = {100 * gbs / copy:.0f}% of copy")  # fmt: skip
    say(f"graphs: {len(graphs.buckets)} buckets, {graphs.replays} replays, {graphs.eager} "
        f"eager fallbacks, capture failure: {graphs.failed}")  # fmt: skip
    plain_bytes = model.weight_bytes + (CONTEXT + 1) * kv_pos
    if args.device == "cuda":
        say(f"GPU operations per plain batch-1 step: eager {device_ops(model, None)}, graphs "
            f"{device_ops(model, graphs)}")  # fmt: skip
        fused_norm_trial(model, args.reps, lambda ms: 100 * plain_bytes / ms / 1e6 / copy, say)
    plain = statistics.fmean(runs["graphs"][(1, 1)])
    ratio = statistics.fmean(runs["graphs"][(1, 16)]) / plain
    model.graphs, graphs.model = None, None
    del model, graphs
    gc.collect()
    return 100 * plain_bytes / plain / 1e6 / copy, ratio


class Ids:
    """A tokenizer double: the engine only decodes token ids to text."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def engine_rows(
    model: TreeModel, batch: int, k: int, prompts: list[list[int]], tokens: int
) -> list[RowResult]:
    """Greedy rows of the tree engine on ``model`` at ``batch`` and K = ``k``."""
    spec = JobSpec.model_validate({
        "name": "device_graphs", "input": {"path": "unused.parquet", "prompt_column": "p"},
        "output": {"dir": "unused"},
        "model": {"model": "unused", "dtype": "float32", "max_num_seqs": batch,
                  "max_model_len": model.max_len - 8},
        "speculative": {"engine": "tree", "method": "ngram", "num_speculative_tokens": 4,
                        "adaptive": False, "tree": {"max_depth": 4}},
        "sampling": {"temperature": 0.0, "max_tokens": tokens},
    })  # fmt: skip
    engine = TreeEngine(spec, k, target=Target(model, Ids(), set(), model.max_len - 8))
    rows = [RowRequest(i, i, None, {}, p) for i, p in enumerate(prompts)]
    unit = UnitRequests(WorkUnit(0, "unused.parquet", 0, len(rows), None, len(rows)), rows)
    done = [r for res in engine.run(ListSource([unit]), lambda: False) for r in res.results]
    return sorted(done, key=lambda r: r.request.row)


def correctness(args: argparse.Namespace, say: Say) -> bool:
    """K=4 trees = K=0 on graphs, and K=0 on graphs = K=0 eager, at batch 1 and 8."""
    cfg = SMOL if args.device == "cuda" else TINY
    model = TreeModel.random(cfg, torch.float32, args.device, 8, 128 + args.tokens)
    model.weights.norm.mul_(PEAK)  # peaked next-token distributions: rows repeat, trees draft
    gen = torch.Generator().manual_seed(0)
    bits = [torch.randint(100, cfg["vocab_size"], (12,), generator=gen).tolist() for _ in range(8)]
    prompts = [b * 3 for b in bits]  # repeats: n-gram trees from the prompt
    graphs, ok = CudaGraphs(model, capture=args.device == "cuda"), True
    for batch in (1, 8):
        runs: dict[str, list] = {}
        for name, k, on in (("plain", 0, True), ("trees", 4, True), ("eager", 0, False)):
            model.graphs = graphs if on else None
            started = time.perf_counter()
            runs[name] = engine_rows(model, batch, k, prompts, args.tokens)
            runs[name + "_s"] = time.perf_counter() - started  # type: ignore[assignment]
        tokens = {n: [r.token_ids for r in runs[n]] for n in ("plain", "trees", "eager")}
        same = sum(a == b for a, b in zip(tokens["trees"], tokens["plain"], strict=True))
        eager = sum(a == b for a, b in zip(tokens["eager"], tokens["plain"], strict=True))
        acc = sum(r.spec.accepted for r in runs["trees"] if r.spec)
        drafted = sum(r.spec.drafted for r in runs["trees"] if r.spec)
        good = same == eager == len(prompts) and drafted > 0
        ok &= good
        say(f"greedy batch {batch}: K=4 trees on graphs = K=0 on graphs on {same}/8 rows "
            f"(accepted {acc}/{drafted} drafted); K=0 on graphs = K=0 eager on {eager}/8 rows; "
            f"{runs['plain_s']:.1f} / {runs['trees_s']:.1f} / {runs['eager_s']:.1f} s: "
            f"{'ok' if good else 'FAIL'}")  # fmt: skip
    say(f"graphs: {len(graphs.buckets)} buckets, {graphs.replays} replays, {graphs.eager} "
        f"eager fallbacks, capture failure: {graphs.failed}")  # fmt: skip
    return ok and graphs.failed is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, help="folder for the transcript, device_graphs.txt")
    ap.add_argument("--reps", type=int, default=20, help="timed steps per cell and round")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per row of the engine runs")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (tiny shapes)"
    say = Say(args.out)
    started = time.perf_counter()
    say(f"tree engine CUDA graphs on {name}, torch {torch.__version__}")
    ok = correctness(args, say)
    share, ratio = speed(args, say)
    say(f"checks {'ok' if ok else 'FAILED'}; wall {time.perf_counter() - started:.0f} s")
    say(f"T4: plain decode {share:.0f}% of copy bandwidth at batch 1; verify 1x16 / plain "
        f"{ratio:.2f}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
