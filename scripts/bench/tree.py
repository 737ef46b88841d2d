"""Draft trees against chains and against vLLM, in one run (issue 13: T1, T3, T5 and T4's
figure). Embedded model, the job's dtype (float32), greedy, CPU; docs/benchmarks.md explains.

- T1: every tree-engine run token-identical to its plain decoding; that against vLLM's, each
  divergence with vLLM's margin at it (a near-tie within DRIFT_FACTOR x the engines' drift);
- T3: tokens per verify step of K-node dynamic n-gram trees against K-node chains, replayed
  over the plain reference's rows (``tree_lib.Tally``), one real pass checking the replay;
- T5: output tokens/s of the tree engine at each K against vLLM's chains, ABBA rounds;
- T4: batch-1 plain decode steps/s x weight bytes against the copy bandwidth.

    .venv/bin/python scripts/bench/tree.py             # 4 prompts per domain, 64 tokens
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

import tree_lib as tl
from harness import JOBS, abba, copy_bandwidth, header, ints, options, parser, ratio

from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.measure.distill_data import Row
from batchspec.spec.tree import TreeSpec


def parse() -> argparse.Namespace:
    """--rows: the first N prompts of every domain; --check-batch: T1's and T3's runs' batch;
    --tree-ks: the tree engine's K (draft nodes per step); --chain-ks: vLLM's n-gram chains'
    K; --t3-nodes: K of trees against chains (replayed), --t3-check the K run for real to
    check the replay; --threads: the tree engine's torch threads (default: torch's). T5's
    trees have the job's shape (``speculative.tree``)."""
    ap = parser(__doc__, job=str(JOBS / "synth_tree.yaml"), rows=4, max_tokens=64, rounds=2)
    options(ap, batches="1,8,16", check_batch=16, tree_ks="0,2,4,8", chain_ks="0,1,3,5")
    return options(ap, t3_nodes="4,8,16", t3_check=8, threads=0).parse_args()


class Bench:
    """The sample, the job, and every tree-engine run kept for the identity check."""

    def __init__(self, args: argparse.Namespace):
        from batchspec.spec.file import load_spec

        self.args = args
        self.spec = load_spec(args.job, [f"sampling.max_tokens={args.max_tokens}"])
        if self.spec.speculative.tree is None:
            raise SystemExit(f"{args.job}: no speculative.tree section")
        self.shape = self.spec.speculative.tree.model_dump()
        self.smp: tl.Sample = tl.sample(self.spec, args.rows)
        s = self.spec.speculative
        self.lookup = (s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
        self.tree_runs: list[tl.Run] = []
        """Every tree-engine run, for T1 against the plain reference."""

    def tree(self, label: str, batch: int, k: int, shape: dict | None = None, lp=None) -> tl.Run:
        r = tl.run(label, tl.variant(self.spec, batch, shape or self.shape), k, self.smp, lp)
        self.tree_runs.append(r)
        return r

    def vllm(self, label: str, batch: int, k: int, lp=None) -> tl.Run:
        return tl.run(label, tl.variant(self.spec, batch, None), k, self.smp, lp)


def t1_reference(b: Bench, batch: int) -> tuple[tl.Run, tl.Run]:
    """Plain greedy on both engines with top-5 logprobs (T1's references)."""
    print(f"\nT1 references (batch {batch}, top-5 logprobs)", flush=True)
    ref = b.tree(f"tree K=0 b{batch} (logprobs)", batch, 0, lp=5)
    vl = b.vllm(f"vLLM K=0 b{batch} (logprobs)", batch, 0, lp=5)
    for r in (ref, vl):
        print(f"  {r.label}: {r.tokens} tokens in {r.seconds:.1f} s", flush=True)
    return ref, vl


def shapes(k: int) -> dict[str, dict]:
    """T3's K-node chain and K-node dynamic tree."""
    return {"chain": {"branching": [1] * k, "max_depth": k}, "tree": {"max_depth": k}}


def t3(b: Bench, ref: tl.Run, nodes: list[int], check_k: int) -> None:
    """Trees vs chains replayed over the plain reference's greedy rows (``Tally``: exact), per
    domain; then one real pass of each at ``check_k`` to show the replay gives the engine's
    counts, row by row."""
    rows = [Row(r.request.row_id, str(r.request.domain), r.request.prompt_token_ids or [],
                r.token_ids or []) for r in ref.results]  # fmt: skip
    doms, max_tokens = [*b.smp.domains, "all"], b.args.max_tokens
    print(f"\nT3 trees vs chains, same n-gram source: mean tokens per verify step = 1 + "
          f"accepted / steps, replayed on {ref.label}'s tokens")  # fmt: skip
    print("| K | shape | " + " | ".join(doms) + " |\n" + "|---" * (len(doms) + 2) + "|")
    for k in nodes:
        tally = tl.Tally()
        for name, shape in shapes(k).items():
            for row in rows:
                tally.add(name, NgramDrafter(*b.lookup), row, k, TreeSpec(**shape), max_tokens)
            cells = " | ".join(f"{tally.per_step(d, name):.3f}" for d in doms)
            print(f"| {k} | {name} | {cells} |")
        gain = [tally.per_step(d, "tree") / tally.per_step(d, "chain") for d in doms]
        print(f"| {k} | tree / chain | " + " | ".join(f"{x:.3f}" for x in gain) + " |", flush=True)
    print("target: tree / chain >= 1.25 at K=8")
    for name, shape in shapes(check_k).items():
        real = b.tree(f"T3 {name} K={check_k}", b.args.check_batch, check_k, shape)
        same = 0
        for row, r in zip(rows, real.results, strict=True):
            drafter, tree = NgramDrafter(*b.lookup), TreeSpec(**shape)
            got = tl.Tally().add(name, drafter, row, check_k, tree, b.args.max_tokens)
            engine = (r.spec.steps, r.spec.accepted) if r.spec else None
            same += engine == (len(got.accepted), sum(got.accepted))
        print(f"  engine {name} K={check_k}: {tl.per_step(real.results):.3f} tokens/step; replay "
              f"gives the engine's counts on {same}/{len(rows)} rows", flush=True)  # fmt: skip


def t5_batch(b: Bench, batch: int) -> dict[str, list[tl.Run]]:
    """Every configuration once per round, ABBA, the two engines interleaved so that neither
    gets the machine's quieter minutes as a block."""
    trees = [f"tree K={k}" for k in ints(b.args.tree_ks)]
    chains = [f"vllm K={k}" for k in ints(b.args.chain_ks)]
    order = [c for pair in zip(trees, chains, strict=False) for c in pair]
    order += [c for c in trees + chains if c not in order]

    def one(config: str, r: int) -> tl.Run:
        eng, k = config.split(" K=")
        label = f"{config} b{batch} r{r + 1}"
        return b.tree(label, batch, int(k)) if eng == "tree" else b.vllm(label, batch, int(k))

    def show(config: str, r: tl.Run) -> str:
        return (f"batch {batch}: {r.rate:.1f} tok/s ({r.tokens} tok, {r.seconds:.1f} s, start "
                f"{r.build_s:.1f} s not counted)")  # fmt: skip

    return abba(order, b.args.rounds, one, show)


def t5_row(batch: int, runs: dict[str, list[tl.Run]]) -> str:
    rates = {c: [r.rate for r in rs] for c, rs in runs.items()}
    mean = {c: statistics.fmean(v) for c, v in rates.items()}
    tree_best = max((c for c in mean if c.startswith("tree")), key=mean.get)
    vllm_best = max((c for c in mean if c.startswith("vllm")), key=mean.get)
    per_k = "; ".join(
        f"{c} {mean[c]:.1f} [{'/'.join(f'{x:.1f}' for x in rates[c])}]"
        + (f" ({tl.per_step(runs[c][0].results):.2f} tok/step)" if not c.endswith("K=0") else "")
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
    rate = statistics.fmean(tl.decode_steps_per_s(r.results) for r in plain)
    gbs, copy = plain[0].weight_bytes * rate / 1e9, copy_bandwidth()
    print(
        f"\nT4 plain decode, tree engine, batch 1 (prefill left out): {rate:.1f} steps/s; "
        f"bandwidth achieved {gbs:.1f} GB/s ({plain[0].weight_bytes / 1e6:.0f} MB x steps/s) "
        f"= {100 * gbs / copy:.0f}% of measured copy bandwidth {copy:.1f} GB/s (target >= 50%)"
    )


def t1_report(b: Bench, ref: tl.Run, vl: tl.Run) -> None:
    print(f"\nT1 greedy lossless ({len(ref.results)} rows; reference: {ref.label})")
    bad = 0
    for r in b.tree_runs:
        if r is ref:
            continue
        differ = tl.differ(ref.results, r.results)
        bad += bool(differ)
        note = f"  DIFFER: {differ[:5]}" if differ else ""
        print(f"  {r.label}: identical {len(r.results) - len(differ)}/{len(ref.results)}{note}")
    print(f"  tree runs with any row not identical to plain: {bad} (target 0)")
    for line in tl.explain(vl.results, ref.results):
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
