"""The tree engine on a GPU, in one short device call, on a machine with torch but no model
weights, vLLM, polars or network (random weights; pydantic's wheels carried: docs/trees.md):

- correctness (issue 21), on a random SmolLM2-135M shape in float32 (logits sharpened, so
  that sampled rows repeat and n-gram trees draft), at batch 1 and 8, the verify forwards and
  prefill chunks on CUDA graphs (``--parts checks``): greedy K=4 n-gram trees and K=4
  draft-model trees (a self-draft of the first half of the layers) token for token K=0's, K=0
  on graphs = K=0 eager; sampled runs (temperature 0.8, top-p 0.9) complete, their seeded
  rows the same when run again;
- speed (issue 35, target T4): plain decode steps at batch 1 and 8 and verifies of 1 x 4, 8,
  16 nodes and 8 x 16 on a random Llama-2-7B shape in bfloat16, eager against graphs in ABBA
  rounds (a step: the forward, an argmax and its host sync), as gpt-fast's "Bandwidth
  achieved" (bytes of weights and KV read per step / step time) beside the copy bandwidth
  measured in the same run (a 1 GiB device-to-device copy); the GPU operations a plain step
  launches; graphs with the element-wise ops as written, against the engine's compiled ones;
- the engine's speed (``--parts engine``) on the 7B shape: K=0 and K=4 trees at batch 1 and
  8, decode ms a forward beside the bare forward's, and each row's prefill (on graphs since
  71a39df: not yet measured on a GPU).

Its last line is T4's; the transcript goes to ``--out``; exit 1 when a check fails. With
``--device cpu`` it runs tiny shapes through the padded forward uncaptured, in seconds (the
suite runs it so).

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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import abba, copy_bandwidth, header, parser, ratio, step_ms, tee

from batchspec.engines.base import ListSource
from batchspec.engines.tree import ops
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
RUNS = {
    "plain": (0, True, False, False),
    "trees": (4, True, False, False),
    "draft": (4, True, False, True),
    "eager": (0, False, False, False),
    "sampled": (0, True, True, False),
    "sampled trees": (4, True, True, False),
    "sampled again": (4, True, True, False),
    "sampled draft": (4, True, True, True),
}
"""The engine runs at each batch size: name: (K, on graphs, sampled, draft-model trees)."""


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


def unfused_trial(model: TreeModel, reps: int, share: Callable[[float], float]) -> None:
    """What compiling the element-wise ops is worth: graphs captured afresh with the ops as
    written (``ops.EAGER``: RMSNorm, residual + RMSNorm, RoPE, SiLU x up; ~20 kernels a layer
    in bf16) against the engine's (``ops.fused()``, one kernel each)."""
    cells, fused = ((1, 1), (1, 16)), model.ops
    try:
        model.ops = ops.EAGER
        model.graphs = trial = CudaGraphs(model)
        ms = {cell: step_ms(model, *cell, reps) for cell in cells}
        print(f"graphs with the element-wise ops as written: plain decode {ms[(1, 1)]:.2f} "
              f"ms/step = {share(ms[(1, 1)]):.0f}% of copy, verify 1 x 16 {ms[(1, 16)]:.2f} "
              f"ms/step; GPU operations per plain step {device_ops(model, trial)}")  # fmt: skip
    except Exception as exc:  # an experiment: the check stands without it
        print(f"graphs with the element-wise ops as written: n/a ({exc!r})")
    finally:
        model.ops = fused


def timings(model: TreeModel, graphs: CudaGraphs, reps: int) -> dict[str, list[dict]]:
    """ms per step of every cell, eager (ops as written, no graphs) and the engine's path on a
    GPU (graphs, ops compiled), in ABBA rounds."""
    fused = model.ops

    def run(mode: str, _round: int) -> dict[tuple[int, int], float]:
        model.graphs = graphs if mode == "graphs" else None
        model.ops = fused if mode == "graphs" else ops.EAGER
        return {cell: step_ms(model, *cell, reps) for cell in CELLS}

    return abba(["eager", "graphs"], 2, run, lambda _m, ms: f"plain {ms[(1, 1)]:.2f} ms/step")


def speed(args: argparse.Namespace) -> tuple[float, str, float]:
    """Every cell eager and on graphs (ABBA); (plain batch-1 share of copy bandwidth,
    verify 1x16 / plain batch 1, plain batch-1 ms), all on graphs."""
    cuda = args.device == "cuda"
    cfg, dtype = (LLAMA2_7B, torch.bfloat16) if cuda else (TINY, torch.float32)
    model = TreeModel.random(cfg, dtype, args.device, 8, CONTEXT + 64)
    model.prefill(0, torch.randint(100, model.vocab_size, (CONTEXT,)).tolist())
    for slot in range(1, 8):
        model.share_prefix(0, slot, CONTEXT)
    graphs = CudaGraphs(model, capture=cuda)
    copy = copy_bandwidth(args.device, (1 << 28) if cuda else (1 << 22), reps=5)
    c = model.cfg
    kv_pos = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * dtype.itemsize
    print(f"model: random {'Llama-2-7B' if cuda else 'tiny'} shape, {dtype}, weights read per "
          f"step {model.weight_bytes / 1e6:,.0f} MB, {CONTEXT} tokens cached per row; copy "
          f"bandwidth {copy:,.0f} GB/s (device-to-device, read + write)")  # fmt: skip
    got = timings(model, graphs, args.reps)
    runs = {(mode, cell): [r[cell] for r in got[mode]] for mode in got for cell in CELLS}
    for rows, nodes in CELLS:
        read = model.weight_bytes + rows * (CONTEXT + nodes) * kv_pos
        what = f"plain decode, batch {rows}" if nodes == 1 else f"verify {rows} x {nodes} nodes"
        for mode in ("eager", "graphs"):
            ms = statistics.fmean(runs[(mode, (rows, nodes))])
            gbs = read / ms / 1e6
            print(f"{what:>24} {mode:>6}: {ms:6.2f} ms/step ({1e3 / ms:6.1f} steps/s), Bandwidth "
                  f"achieved: {gbs:,.2f} GB/s = {100 * gbs / copy:.0f}% of copy")  # fmt: skip
        cell = (rows, nodes)
        print(f"{what:>24} graphs / eager: {ratio(runs[('graphs', cell)], runs[('eager', cell)])}")
    print(f"graphs: {len(graphs.buckets)} buckets, {graphs.replays} replays, {graphs.eager} "
          f"eager fallbacks, capture failure: {graphs.failed}")  # fmt: skip
    plain_bytes = model.weight_bytes + (CONTEXT + 1) * kv_pos
    if cuda:
        fused, model.ops = model.ops, ops.EAGER
        eager_ops, model.ops = device_ops(model, None), fused
        print(f"GPU operations per plain batch-1 step: eager {eager_ops}, graphs "
              f"{device_ops(model, graphs)}")  # fmt: skip
        unfused_trial(model, args.reps, lambda ms: 100 * plain_bytes / ms / 1e6 / copy)
    plain = runs[("graphs", (1, 1))]
    share = 100 * plain_bytes / statistics.fmean(plain) / 1e6 / copy
    model.graphs, graphs.model = None, None
    del model, graphs
    gc.collect()
    return share, ratio(runs[("graphs", (1, 16))], plain), statistics.fmean(plain)


def engine_speed(args: argparse.Namespace, plain_ms: float) -> None:
    """The whole engine on the 7B shape (graphs, compiled ops), greedy, 8 rows, K=0 and K=4
    n-gram trees at batch 1 and 8 (ABBA): tokens/s from the first row scheduled to the last
    token (the engine's close, a gc.collect of ~0.4 s, left out), and at batch 1 the decode
    steps' ms per target forward (each row's first token to its last) against the bare
    forward's (``plain_ms``): what drafting, acceptance and the host syncs add to a 5 ms
    forward; a row's prefill (eager) is printed apart. Random weights: on this shape the rows
    do not repeat, so K=4 prices drafting and 8-node verifies with nothing accepted."""
    cuda = args.device == "cuda"
    cfg, dtype = (LLAMA2_7B, torch.bfloat16) if cuda else (TINY, torch.float32)
    model = TreeModel.random(cfg, dtype, args.device, 8, 128 + args.tokens)
    model.weights.norm.mul_(PEAK)
    gen = torch.Generator().manual_seed(0)
    bits = [torch.randint(100, cfg["vocab_size"], (12,), generator=gen).tolist() for _ in range(8)]
    prompts = [b * 3 for b in bits]
    engine_rows(model, 8, 4, prompts, 8, False, False)  # captures and compiles, untimed

    def run(config: str, _round: int) -> dict[str, float]:
        batch, k = (int(v) for v in config.split("/"))
        rows = engine_rows(model, batch, k, prompts, args.tokens, False, False)
        times = [r.timing or {} for r in rows]
        tokens = sum(len(r.token_ids or []) for r in rows)
        forwards = tokens - sum(r.spec.accepted for r in rows if r.spec)
        span = max(t["last_token"] for t in times) - min(t["scheduled"] for t in times)
        decoding = sum(t["last_token"] - t["first_token"] for t in times)
        return {
            "tok/s": tokens / span,
            "per forward": tokens / forwards,
            "decode ms": 1e3 * decoding / (forwards - len(rows)),  # a row's first: its prefill
            "prefill ms": 1e3 * statistics.fmean(t["first_token"] - t["scheduled"] for t in times),
        }

    got = abba(["1/0", "1/4", "8/0", "8/4"], 2, run, lambda _c, t: f"{t['tok/s']:.0f} tok/s")
    for config, runs in got.items():
        batch, k = config.split("/")
        mean = {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}
        per = (f", decode {mean['decode ms']:.2f} ms a forward, prefill {mean['prefill ms']:.1f} "
               f"ms a row" if batch == "1" else "")  # fmt: skip
        print(f"engine, batch {batch}, K={k}: {mean['tok/s']:6.1f} tok/s, "
              f"{mean['per forward']:.2f} tokens a forward{per}")  # fmt: skip
    print(f"the bare plain forward at batch 1 (graphs): {plain_ms:.2f} ms")
    for batch in ("1", "8"):
        trees, plain = got[f"{batch}/4"], got[f"{batch}/0"]
        per_forward = statistics.fmean(r["per forward"] for r in trees)
        speedup = ratio([r["tok/s"] for r in trees], [r["tok/s"] for r in plain])
        print(f"engine, batch {batch}: K=4 / K=0 {speedup} at {per_forward:.2f} tokens a forward")


class Ids:
    """A tokenizer double: the engine only decodes token ids to text."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def engine_rows(
    model: TreeModel,
    batch: int,
    k: int,
    prompts: list[list[int]],
    tokens: int,
    sampled: bool,
    draft: bool,
) -> list[RowResult]:
    """The tree engine's rows on ``model`` at ``batch`` and K = ``k``: greedy, or sampled
    (even rows seeded, odd rows drawing from the engine's generator); n-gram trees, or with
    ``draft`` draft-model trees of the target's first half of layers."""
    layers = list(range(model.cfg.num_hidden_layers // 2))
    tree = {"max_depth": 3, "draft_layers": layers} if draft else {"max_depth": 4}
    sampling = {"temperature": 0.8, "top_p": 0.9} if sampled else {"temperature": 0.0}
    spec = JobSpec.model_validate({
        "name": "device_graphs", "input": {"path": "unused.parquet", "prompt_column": "p"},
        "output": {"dir": "unused"},
        "model": {"model": "unused", "dtype": "float32", "max_num_seqs": batch,
                  "max_model_len": model.max_len - 8},
        "speculative": {"engine": "tree", "method": "draft_model" if draft else "ngram",
                        "num_speculative_tokens": 4, "adaptive": False, "tree": tree},
        "sampling": {**sampling, "max_tokens": tokens},
    })  # fmt: skip
    engine = TreeEngine(spec, k, target=Target(model, Ids(), set(), model.max_len - 8))
    seeds = [1000 + i if sampled and i % 2 == 0 else None for i in range(len(prompts))]
    rows = [
        RowRequest(i, i, None, {}, p, seed=s)
        for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]
    unit = UnitRequests(WorkUnit(0, "unused.parquet", 0, len(rows), None, len(rows)), rows)
    done = [r for res in engine.run(ListSource([unit]), lambda: False) for r in res.results]
    engine.close()
    return sorted(done, key=lambda r: r.request.row)


def verdict(name: str, rows: dict[str, list[RowResult]]) -> tuple[bool, str]:
    """A run's check: greedy rows token for token K=0's on graphs (and trees that drafted);
    sampled rows complete, and the seeded ones the same when the engine runs again."""
    got, spec = rows[name], [r.spec for r in rows[name] if r.spec]
    drafted, accepted = sum(s.drafted for s in spec), sum(s.accepted for s in spec)
    drafts = f", accepted {accepted}/{drafted} drafted" if RUNS[name][0] else ""
    if name.startswith("sampled"):
        ok = all(r.token_ids and r.error is None for r in got)
        if name != "sampled trees":
            return ok, "rows complete" + drafts
        again = {r.request.row: r.token_ids for r in rows["sampled again"]}
        same = all(r.token_ids == again[r.request.row] for r in got if r.request.seed)
        return ok and same, f"rows complete, seeded rows {'repeat' if same else 'DIFFER'}" + drafts
    same = sum(a.token_ids == b.token_ids for a, b in zip(got, rows["plain"], strict=True))
    ok = same == len(got) and (drafted > 0 or not RUNS[name][0])
    return ok, f"{same}/{len(got)} rows = K=0 on graphs" + drafts


def correctness(args: argparse.Namespace) -> bool:
    """Every run of ``RUNS`` at batch 1 and 8, one line each with its check."""
    cfg = SMOL if args.device == "cuda" else TINY
    model = TreeModel.random(cfg, torch.float32, args.device, 8, 128 + args.tokens)
    model.weights.norm.mul_(PEAK)  # peaked next-token distributions: rows repeat, trees draft
    gen = torch.Generator().manual_seed(0)
    bits = [torch.randint(100, cfg["vocab_size"], (12,), generator=gen).tolist() for _ in range(8)]
    prompts = [b * 3 for b in bits]  # repeats: n-gram trees from the prompt
    graphs, ok = CudaGraphs(model, capture=args.device == "cuda"), True
    for batch in (1, 8):
        rows, took = {}, {}
        for name, (k, on, sampled, draft) in RUNS.items():
            model.graphs = graphs if on else None
            started = time.perf_counter()
            rows[name] = engine_rows(model, batch, k, prompts, args.tokens, sampled, draft)
            took[name] = time.perf_counter() - started
        for name in list(RUNS)[1:]:
            good, what = verdict(name, rows)
            ok &= good
            print(f"batch {batch} {name:>13} (K={RUNS[name][0]}, {took[name]:.1f} s): {what}: "
                  f"{'ok' if good else 'FAIL'}", flush=True)  # fmt: skip
    print(f"graphs: {len(graphs.buckets)} buckets, {graphs.replays} replays, {graphs.eager} "
          f"eager fallbacks, capture failure: {graphs.failed}")  # fmt: skip
    return ok and graphs.failed is None


def main() -> int:
    # --out: the folder of the transcript, device_graphs.txt; --reps: timed steps per cell and
    # round; --tokens: tokens per row of the engine runs; --parts: checks (the engine's rows),
    # engine (its speed), beside the step timings always run.
    ap = parser(__doc__, out=None, reps=20, tokens=48)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--parts", default="checks,engine", help="besides the step timings")
    args = ap.parse_args()
    if args.out is not None:
        tee(Path(args.out) / "device_graphs.txt")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    header()
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (tiny shapes)"
    started = time.perf_counter()
    print(f"tree engine CUDA graphs on {name}, torch {torch.__version__}")
    ok = correctness(args) if "checks" in args.parts else True
    share, ratio_1x16, plain_ms = speed(args)
    if "engine" in args.parts:
        engine_speed(args, plain_ms)
    print(f"checks {'ok' if ok else 'FAILED'}; wall {time.perf_counter() - started:.0f} s")
    print(f"T4: plain decode {share:.0f}% of copy bandwidth at batch 1; verify 1x16 / plain "
          f"{ratio_1x16}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
