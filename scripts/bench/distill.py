"""A distilled EAGLE-3 head against n-gram trees, the self-draft and plain decoding (issue 23's
D1 and D2), on the held-out rows of a job's output (``batchspec distill`` trained on the rest).
Embedded model, float32, greedy, CPU, the tree engine; docs/distill.md has the figures.

- D1: tokens per verify step and per target forward, per domain, at 4 and 8 nodes, replayed
  (``tree_lib.Tally``) for the head, n-gram trees, n-gram first, and the self-draft;
- D2: tokens/s of the tree engine with each at each batch size, ABBA, rows checked identical
  to plain; drafting and verifying timed apart; the head's forward beside the target's.

    .venv/bin/python scripts/bench/distill.py --output /tmp/d23/out --batches 1,8,16

The last line: ``head: mean tokens per verify step X at 8 nodes (n-gram trees Y), tree engine
with head / plain: Z at batch 1``.

- D3, ``--curve``: how the head's acceptance grows with data: ``batchspec distill`` of the job's
  committed rows at each training size, every head measured on the same held-out rows (the
  job's fixed fraction); per size, training rows and tokens, wall time, the last epoch's loss
  and top-1 agreement at depth 1, and tokens per verify step on the held-out rows at 4 and 8
  nodes, the head's beside n-gram trees'. The last lines fit tokens per step at 8 nodes against
  log10(training tokens) and extrapolate to a job of ``--rows-per-job`` rows (over orders of
  magnitude, stated as such).

    .venv/bin/python scripts/bench/distill.py --job jobs/synth_data.yaml --output /tmp/d3/out \\
        --curve 40,80,160,320 --epochs 6
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from harness import JOBS, abba, cli, flags, header, ints, options, parser, timed
from tree_lib import Run, Sample, Tally, committed, differ, per_step, run, variant

from batchspec.engines.tree.drafter import ModelDrafter, growth_scratch
from batchspec.engines.tree.eagle import EagleDrafter, StoredFeatures
from batchspec.engines.tree.eagle_head import TappedModel, load_head
from batchspec.engines.tree.hybrid import NgramFirst
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.measure.distill import load_target
from batchspec.measure.distill_data import Row
from batchspec.spec.tree import TreeShape
from batchspec.units import RowRequest, WorkUnit


def parse() -> argparse.Namespace:
    """--head: the head (default OUTPUT/drafts/eagle3); --holdout: as distill was run; --depth:
    the deepest draft node; --skip: the layers the self-draft skips; --self-rows: self-draft
    rows per domain; --rows: held-out prompts run per batch size; --lookup: n-gram bounds,
    min,max (every n-gram draft); --curve: training rows of D3's heads, --epochs and --vocab
    theirs, --rows-per-job the size of its extrapolation's job."""
    ap = parser(__doc__, job=str(JOBS / "synth_tree.yaml"), head=None, holdout=0.1, depth=6)
    options(ap, skip="10,12,14,16,18,20", self_rows=2, batches="1,8,16", rows=16, max_tokens=64)
    options(ap, lookup="1,4", curve=None, epochs=6, vocab=4096, rows_per_job=100_000)
    ap.add_argument("--output", required=True, help="the job's output directory")
    return ap.parse_args()


def overrides(a: argparse.Namespace) -> list[str]:
    """The job as benchmarked: its n-gram bounds (``--lookup``) and max_tokens."""
    lo, hi = a.lookup.split(",")
    return [
        f"speculative.prompt_lookup_min={lo}",
        f"speculative.prompt_lookup_max={hi}",
        f"sampling.max_tokens={a.max_tokens}",
    ]


def d1(a: argparse.Namespace, held: list[Row], head_dir: Path, spec) -> dict[int, Tally]:
    """Each drafter replayed over the held-out rows (``Tally``), per node count."""
    target = load_target(spec)
    keep = [i for i in range(target.cfg.num_hidden_layers) if i not in ints(a.skip)]
    head = load_head(head_dir, target)
    tapped = TappedModel.of(target, head.cfg.aux_layers)
    shape, out = TreeShape(max_depth=a.depth), {}
    lookup = (spec.speculative.prompt_lookup_min, spec.speculative.prompt_lookup_max)
    for k in (4, 8):
        out[k], seen = Tally(), Counter()
        room = growth_scratch(k, a.depth)  # the nodes a tree's growth feeds behind a row
        for r in held:
            tapped.prefill(0, r.tokens)
            feats = tapped.take(0)
            tapped.release(0)
            size = len(r.tokens) + room
            heads = [EagleDrafter(head, StoredFeatures(feats), 1, size) for _ in range(2)]
            hybrid = NgramFirst(NgramDrafter(*lookup), heads[1])
            drafters = {"head": heads[0], "ngram": NgramDrafter(*lookup), "hybrid": hybrid}
            seen[r.domain] += 1
            if seen[r.domain] <= a.self_rows:
                draft = target.layers_only(keep, 1, size)
                drafters["self"] = ModelDrafter(draft, target.vocab_size)
            for name, drafter in drafters.items():
                out[k].add(name, drafter, r, k, shape)
    return out


def print_d1(tallies: dict[int, Tally]) -> dict[str, float]:
    """Per verify step that drafted (the issue's D1), then per target forward (every step:
    one that drafts nothing is a plain step, which flatters a drafter that often has none in
    the first table, as n-gram trees do); each domain weighs the same in the mean. Returns
    the first table's means at 8 nodes."""
    doms = sorted({d for t in tallies.values() for d, _ in t.sums})
    for title, of in (
        ("verify step", Tally.per_step),
        ("target forward (every step)", Tally.per_forward),
    ):
        print(f"\nD1: tokens per {title} on held-out rows (replayed)")
        print(f"{'domain':<13}" + "".join(f"{f'{n}@{k}':>10}" for k in tallies for n in DRAFTS))
        for d in [*doms, "mean"]:
            cells = [
                mean([of(t, x, n) for x in doms]) if d == "mean" else of(t, d, n)
                for t in tallies.values()
                for n in DRAFTS
            ]
            print(f"{d:<13}" + "".join(f"{c:>10.2f}" for c in cells))
    return {n: mean([tallies[8].per_step(x, n) for x in doms]) for n in DRAFTS}


DRAFTS = ("head", "ngram", "hybrid", "self")
"""``hybrid``: n-gram trees where the trie continues the row, the head's elsewhere
(``tree.ngram_first``)."""


def mean(values: list[float | None]) -> float:
    got = [v for v in values if v is not None and v == v]
    return statistics.mean(got) if got else float("nan")


def d2(a: argparse.Namespace, held: list[Row], head_dir: Path, spec) -> dict[int, float]:
    """Tokens/s of plain, n-gram and head trees per batch size; head / plain per batch."""
    rows = held[: a.rows]
    reqs = [RowRequest(i, r.row_id, r.domain, {}, r.prompt) for i, r in enumerate(rows)]
    smp = Sample(WorkUnit(0, "held-out", 0, len(reqs), None, len(reqs)), reqs)
    ratios, tree = {}, {"max_depth": a.depth}
    head = {"method": "eagle3", "model": str(head_dir)}
    for batch in ints(a.batches):
        configs = {
            "plain": (variant(spec, batch, tree), 0),
            "ngram": (variant(spec, batch, tree), 4),
            "head": (variant(spec, batch, tree, **head), 4),
            "hybrid": (variant(spec, batch, tree | {"ngram_first": True}, **head), 4),
        }
        ref: list[Run] = []

        def one(label: str, r: int, configs=configs, ref=ref) -> Run:
            got = run(label, *configs[label], smp, split=True)
            ref[:] = ref or [got]  # the first run: every other's identity is against it
            return got

        def show(label: str, r: Run, batch=batch, ref=ref) -> str:
            same = len(r.results) - len(differ(ref[0].results, r.results))
            split_s = ", ".join(f"{p} {v:.1f} s" for p, v in r.parts.items())
            return (
                f"batch {batch:>2} {r.rate:7.1f} tok/s  {per_step(r.results):.2f} tokens/step"
                f"  identical {same}/{len(r.results)}  ({split_s} of {r.seconds:.1f} s)"
            )

        runs = abba(list(configs), 2, one, show)
        got = {label: [r.rate for r in rs] for label, rs in runs.items()}
        rate = {k: statistics.mean(v) for k, v in got.items()}
        ratios[batch] = rate["head"] / rate["plain"]
        ratios[-batch] = rate["hybrid"] / rate["plain"]
        print(f"batch {batch:>2}: head / plain {ratios[batch]:.2f}, ngram / plain "
              f"{rate['ngram'] / rate['plain']:.2f}, hybrid / plain {ratios[-batch]:.2f}",
              flush=True)  # fmt: skip
    return ratios


def per_depth(head_dir: Path, spec) -> None:
    """The head's forward (one node) beside the target's one-row forward, best of 20."""
    target = load_target(spec)
    head = load_head(head_dir, target)
    tapped = TappedModel.of(target, head.cfg.aux_layers)
    tapped.prefill(0, list(range(100, 164)))
    feats = tapped.take(0)
    drafter = EagleDrafter(head, StoredFeatures(feats), 1, 256)
    one = torch.ones(1, 1, dtype=torch.long)

    def best(fn: Callable[[], object]) -> float:
        return timed(fn, 20, min) * 1e3

    hid = torch.zeros(1, 1, head.fc.shape[0])
    mask = torch.ones(1, 1, 1, dtype=torch.bool)
    h_ms = best(lambda: drafter._run([0], one, hid, one * 3, mask, None))
    lp_ms = best(lambda: drafter._logprobs(hid[0]))
    t_ms = best(lambda: tapped.verify([0], one, one * 64, mask))
    tapped.release(0)
    plain = load_target(spec)
    compiled = plain.use_one_row_kernel()
    how = (
        "in C" if plain.few_rows is not None else "compiled" if compiled else "eager (no compiler)"
    )
    plain.prefill(0, list(range(100, 164)))
    c_ms = best(lambda: plain.verify([0], one, one * 64, mask))
    vocab = head.cfg.draft_vocab
    print(f"\nhead forward per depth {h_ms + lp_ms:.2f} ms (layer {h_ms:.2f}, projection onto "
          f"{vocab} tokens {lp_ms:.2f}); target one-row forward {t_ms:.2f} ms eager, "
          f"{c_ms:.2f} ms {how}")  # fmt: skip


def curve_point(a: argparse.Namespace, rows: int) -> dict:
    """D3: one ``distill`` at ``rows`` training rows (its own head directory), its table row
    printed; its record, with the head's tokens per step at 8 nodes (``at8``)."""
    name = f"curve-{rows}-e{a.epochs}"
    sizes = flags(train_rows=rows, epochs=a.epochs, vocab=a.vocab)
    _, took = cli("distill", a.job, *flags(output=a.output, name=name), *sizes, check=True)
    r = json.loads((Path(a.output) / "drafts" / name / "record.json").read_text())
    at = {f"{who}@{n}": statistics.fmean(d[n][who] for d in r["held_out"].values())
          for n in ("4", "8") for who in ("head", "ngram")}  # fmt: skip
    last = r["epochs"][-1]
    print(f"| {r['rows']['train']} | {r['tokens']['train']} | {took:.0f} | {last['loss']:.2f} "
          f"| {last['top1_agreement'][0]:.2f} | {at['head@4']:.2f} | {at['ngram@4']:.2f} "
          f"| {at['head@8']:.2f} | {at['ngram@8']:.2f} |", flush=True)  # fmt: skip
    return r | {"at8": at["head@8"]}


def curve(a: argparse.Namespace) -> None:
    """D3: a point per training size, then the fit against log10(training tokens)."""
    cols = "train rows | train tokens | wall s | loss | top-1 d1 | head@4 | ngram@4 | head@8"
    print(f"| {cols} | ngram@8 |\n" + "|---" * 9 + "|")
    points = [curve_point(a, n) for n in ints(a.curve)]
    r = points[-1]
    print(
        f"held out: {r['rows']['held_out']} rows, domains {', '.join(r['held_out'])}; "
        f"{a.epochs} epochs, draft vocabulary {a.vocab}; peak RSS {r['peak_rss_mb']} MB"
    )
    if len(points) >= 2:
        xs = [math.log10(p["tokens"]["train"]) for p in points]
        slope, icpt = statistics.linear_regression(xs, [p["at8"] for p in points])
        per_row = statistics.fmean(p["tokens"]["train"] / p["rows"]["train"] for p in points)
        job = per_row * a.rows_per_job
        print(f"fit: head tokens per step at 8 nodes = {icpt:.2f} + {slope:.3f} * log10(train "
              f"tokens); at {a.rows_per_job:,} rows ({job:.2g} tokens): "
              f"{icpt + slope * math.log10(job):.2f} (an extrapolation)")  # fmt: skip


def main() -> None:
    a = parse()
    header()
    if a.curve:
        return curve(a)
    spec, rows, held = committed(a.job, a.output, a.holdout, overrides(a))
    head_dir = Path(a.head or Path(a.output) / "drafts" / "eagle3")
    print(f"{len(held)} held-out rows of {len(rows)}; head {head_dir}", flush=True)
    means = print_d1(d1(a, held, head_dir, spec))
    per_depth(head_dir, spec)
    ratios = d2(a, held, head_dir, spec)
    z = ratios.get(1, float("nan"))
    x, y = means["head"], means["ngram"]
    print(f"head: mean tokens per verify step {x:.2f} at 8 nodes (n-gram trees {y:.2f}), "
          f"tree engine with head / plain: {z:.2f} at batch 1 (n-gram first: "
          f"{ratios.get(-1, float('nan')):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
