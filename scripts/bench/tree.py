"""Draft trees against chains and against vLLM, in one run (issue 13's T1, T3, T5, and T4's
figure from the same runs). Embedded model, the job's dtype (float32), greedy, CPU.

- T1 greedy lossless: every tree-engine run below (each K, each batch size, trees and chains)
  token-identical, row by row, to the same engine's plain decoding (K=0 at ``--check-batch``);
  that plain decoding against vLLM's plain float32 greedy: identical on >= 95% of rows, each
  divergent row with vLLM's margin at its first differing token (a near-tie when within
  DRIFT_FACTOR x the logprob drift the two engines show on agreed tokens).
- T3 trees beat chains: mean tokens per verify step (1 + accepted / steps) of a K-node dynamic
  n-gram tree against a K-node n-gram chain (``branching: [1] * K``), per domain and overall
  (target: tree / chain >= 1.25 at K=8). Replayed from the plain reference's tokens (exact in
  greedy decoding, see ``tree_lib.replay``), then one real engine pass of each shape
  at ``--t3-check`` nodes shows the replay giving the engine's own per-row counts.
- T5 throughput: output tokens/s (prefill included, engine start excluded) of the tree engine
  with the job's dynamic trees at each K against vLLM's n-gram chains at each K, per batch
  size; every configuration once per round, tree and vLLM interleaved, the order reversed
  every other round (ABBA), a fresh engine each time; means over rounds. "Best" is the best
  measured K on each side (target at batch 1: tree best / vLLM best >= 1.2).
- T4's gpt-fast figure: the tree engine's plain decode steps/s at batch 1 (prefill left out)
  x the weight bytes one step reads, against this machine's copy bandwidth.

vLLM's engine start (26-70 s here) dominates the wall time: the default run starts it
1 + rounds x batches x chain Ks = 25 times.

    .venv/bin/python scripts/bench/tree.py             # 4 prompts per domain, 64 tokens
    .venv/bin/python scripts/bench/tree.py --quick     # smoke: 1 per domain, 32 tokens, batch 1
    .venv/bin/python scripts/bench/tree.py --batches 1 --rows 2 --threads 1
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from harness import abba, header, ratio  # noqa: E402
from tree_lib import (  # noqa: E402
    Run,
    Sample,
    copy_bandwidth,
    counts,
    decode_steps_per_s,
    explain,
    identical,
    per_step,
    replay_rows,
    run,
    sample,
    variant,
)

QUICK = {
    "rows": 1,
    "max_tokens": 32,
    "rounds": 1,
    "batches": "1",
    "check_batch": 6,
    "tree_ks": "0,4",
    "chain_ks": "3",
    "t3_nodes": "4,8,16",
}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    ap.add_argument("--rows", type=int, default=4, help="first N prompts of every domain")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--check-batch", type=int, default=16, help="batch of T1's and T3's runs")
    ap.add_argument("--tree-ks", default="0,2,4,8", help="tree engine K (draft nodes per step)")
    ap.add_argument("--chain-ks", default="0,1,3,5", help="vLLM n-gram chain K")
    ap.add_argument("--t3-nodes", default="4,8,16", help="K for trees vs chains (replayed)")
    ap.add_argument("--t3-check", type=int, default=8, help="K run for real to check the replay")
    ap.add_argument("--depth", type=int, default=None, help="T5 trees' max_depth (job's)")
    ap.add_argument(
        "--threads", type=int, default=None, help="tree engine's torch threads (torch's default)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke: " + str(QUICK))
    args = ap.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Bench:
    """The sample, the job, and every tree-engine run kept for the identity check."""

    def __init__(self, args: argparse.Namespace):
        from batchspec.spec.file import load_spec

        self.args = args
        self.spec = load_spec(args.job, [f"sampling.max_tokens={args.max_tokens}"])
        if self.spec.speculative.tree is None:
            raise SystemExit(f"{args.job}: no speculative.tree section")
        self.shape = self.spec.speculative.tree.model_dump()
        if args.depth is not None:
            self.shape["max_depth"] = args.depth
        self.smp: Sample = sample(self.spec, args.rows)
        s = self.spec.speculative
        self.lookup = (s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
        self.tree_runs: list[Run] = []
        """Every tree-engine run, for T1 against the plain reference."""

    def tree(self, label: str, batch: int, k: int, shape: dict | None = None, lp=None) -> Run:
        r = run(label, variant(self.spec, batch, shape or self.shape), k, self.smp, lp)
        self.tree_runs.append(r)
        return self._checked(r)

    def vllm(self, label: str, batch: int, k: int, lp=None) -> Run:
        return self._checked(run(label, variant(self.spec, batch, None), k, self.smp, lp))

    @staticmethod
    def _checked(r: Run) -> Run:
        if r.errors():
            print(f"  {r.label}: ERROR rows: {r.errors()[:3]}", flush=True)
        return r


def t1_reference(b: Bench, batch: int) -> tuple[Run, Run]:
    """Plain greedy on both engines with top-5 logprobs (T1's references)."""
    print(f"\nT1 references (batch {batch}, top-5 logprobs)", flush=True)
    ref = b.tree(f"tree K=0 b{batch} (logprobs)", batch, 0, lp=5)
    vl = b.vllm(f"vLLM K=0 b{batch} (logprobs)", batch, 0, lp=5)
    for r in (ref, vl):
        print(f"  {r.label}: {r.tokens} tokens in {r.seconds:.1f} s", flush=True)
    return ref, vl


def t3(b: Bench, ref: Run, nodes: list[int], check_k: int) -> None:
    """Trees vs chains from the plain reference's tokens (``replay``: exact for greedy rows),
    then one real pass of each at ``check_k`` to show the replay gives the engine's counts."""
    doms, max_tokens, lookup = b.smp.domains, b.args.max_tokens, b.lookup
    print(f"\nT3 trees vs chains, same n-gram source: mean tokens per verify step = 1 + "
          f"accepted / steps, replayed on {ref.label}'s tokens")  # fmt: skip
    print("| K | shape | " + " | ".join(doms) + " | all |")
    print("|---" * (len(doms) + 3) + "|")
    for k in nodes:
        shapes = {"tree": {"max_depth": k}, "chain": {"branching": [1] * k, "max_depth": k}}
        rows = {n: replay_rows(ref.results, max_tokens, k, sh, lookup) for n, sh in shapes.items()}
        for name, label in (("tree", f"tree (max_depth {k})"), ("chain", f"chain [1]*{k}")):
            cells = [f"{per_step(rows[name], d):.3f}" for d in doms]
            print(f"| {k} | {label} | " + " | ".join(cells) + f" | {per_step(rows[name]):.3f} |")
        cells = [f"{per_step(rows['tree'], d) / per_step(rows['chain'], d):.3f}" for d in doms]
        total = per_step(rows["tree"]) / per_step(rows["chain"])
        print(f"| {k} | tree / chain | " + " | ".join(cells) + f" | **{total:.3f}** |", flush=True)
    print("target: tree / chain >= 1.25 at K=8")
    for name, shape in (("tree", {"max_depth": check_k}), ("chain", {"branching": [1] * check_k})):
        shape = {**shape, "max_depth": check_k}
        real = b.tree(f"T3 {name} K={check_k}", b.args.check_batch, check_k, shape)
        replayed = replay_rows(ref.results, max_tokens, check_k, shape, lookup)
        same = sum(counts(x) == counts(y) for x, y in zip(real.results, replayed, strict=True))
        print(f"  engine {name} K={check_k}: {per_step(real.results):.3f} tokens/step; replay "
              f"gives the engine's counts on {same}/{len(replayed)} rows", flush=True)  # fmt: skip


def t5_batch(b: Bench, batch: int) -> dict[str, list[Run]]:
    """Every configuration once per round, ABBA, the two engines interleaved so that neither
    gets the machine's quieter minutes as a block."""
    trees = [f"tree K={k}" for k in ints(b.args.tree_ks)]
    chains = [f"vllm K={k}" for k in ints(b.args.chain_ks)]
    order = [c for pair in zip(trees, chains, strict=False) for c in pair]
    order += [c for c in trees + chains if c not in order]

    def one(config: str, r: int) -> Run:
        eng, k = config.split(" K=")
        label = f"{config} b{batch} r{r + 1}"
        return b.tree(label, batch, int(k)) if eng == "tree" else b.vllm(label, batch, int(k))

    def show(config: str, r: Run) -> str:
        return (f"batch {batch}: {r.rate:.1f} tok/s ({r.tokens} tok, {r.seconds:.1f} s, start "
                f"{r.build_s:.1f} s not counted)")  # fmt: skip

    return abba(order, b.args.rounds, one, show)


def t5_row(batch: int, runs: dict[str, list[Run]]) -> str:
    rates = {c: [r.rate for r in rs] for c, rs in runs.items()}
    mean = {c: statistics.fmean(v) for c, v in rates.items()}
    tree_best = max((c for c in mean if c.startswith("tree")), key=mean.get)
    vllm_best = max((c for c in mean if c.startswith("vllm")), key=mean.get)
    per_k = "; ".join(
        f"{c} {mean[c]:.1f} [{'/'.join(f'{x:.1f}' for x in rates[c])}]"
        + (f" ({per_step(runs[c][0].results):.2f} tok/step)" if not c.endswith("K=0") else "")
        for c in sorted(runs)
    )
    return (
        f"| {batch} | {mean[tree_best]:.1f} ({tree_best[5:]}) | {mean[vllm_best]:.1f} "
        f"({vllm_best[5:]}) | **{ratio(rates[tree_best], rates[vllm_best])}** | {per_k} |"
    )


def bandwidth(runs: dict) -> None:
    """T4's figure from the batch-1 plain runs of T5."""
    plain = runs.get("tree K=0")
    if not plain or plain[0].weight_bytes is None:
        return
    rate = statistics.fmean(decode_steps_per_s(r.results) for r in plain)
    gbs, copy = plain[0].weight_bytes * rate / 1e9, copy_bandwidth()
    print(
        f"\nT4 plain decode, tree engine, batch 1 (prefill left out): {rate:.1f} steps/s; "
        f"bandwidth achieved {gbs:.1f} GB/s ({plain[0].weight_bytes / 1e6:.0f} MB x steps/s) "
        f"= {100 * gbs / copy:.0f}% of measured copy bandwidth {copy:.1f} GB/s (target >= 50%)"
    )


def t1_report(b: Bench, ref: Run, vl: Run) -> None:
    print(f"\nT1 greedy lossless ({len(ref.results)} rows; reference: {ref.label})")
    bad = 0
    for r in b.tree_runs:
        if r is ref:
            continue
        same, differ = identical(ref.results, r.results)
        bad += bool(differ)
        note = f"  DIFFER: {differ[:5]}" if differ else ""
        print(f"  {r.label}: identical {same}/{len(ref.results)}{note}")
    print(f"  tree runs with any row not identical to plain: {bad} (target 0)")
    for line in explain(vl.results, ref.results):
        print(line)


def main() -> None:
    args = parse()
    header()
    # A killed run still closes its engine (vLLM's engine process would outlive it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    batches = ints(args.batches)
    started = time.perf_counter()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    b = Bench(args)
    print(
        f"job {args.job}: {len(b.smp.rows)} prompts ({args.rows} per domain, "
        f"{len(b.smp.domains)} domains), max_tokens {args.max_tokens}, dtype "
        f"{b.spec.model.dtype}, greedy, tree {b.shape}, batches {batches}, {args.rounds} "
        f"rounds; tree engine {torch.get_num_threads()} torch threads (vLLM's CPU worker binds its "
        f"own); load average {os.getloadavg()[0]:.1f} (other processes distort timings)",
        flush=True,
    )
    ref, vl = t1_reference(b, args.check_batch)
    t3(b, ref, ints(args.t3_nodes), args.t3_check)
    table = []
    for batch in batches:
        print(f"\nT5 batch {batch}: output tokens/s per run", flush=True)
        runs = t5_batch(b, batch)
        table.append(t5_row(batch, runs))
        if batch == 1:
            bandwidth(runs)
    print(f"\nT5 output tokens/s, mean of {args.rounds} rounds (tree / vLLM target >= 1.2 at b1)")
    print("| batch | tree best (K) | vLLM best chain (K) | ratio [rounds] | per-K [rounds] |")
    print("|---|---|---|---|---|")
    print("\n".join(table))
    t1_report(b, ref, vl)
    print(
        f"\nwall time {(time.perf_counter() - started) / 60:.1f} min; load average at the end "
        f"{os.getloadavg()[0]:.1f}; tree engine torch threads at the end {torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
