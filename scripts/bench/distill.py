"""A distilled EAGLE-3 head against n-gram trees, the self-draft and plain decoding (issue 23's
D1 and D2). Embedded model, float32, greedy, CPU, the tree engine.

Rows: the committed rows of a job's output directory; the head (``batchspec distill``) is
trained on some and measured on the rows it never saw (its held-out fraction, same domains).

- D1 acceptance: mean tokens per verify step (accepted + 1) per domain on the held-out rows,
  at 4 and 8 nodes (dynamic trees up to ``--depth`` deep), of the head, of n-gram trees and of
  the self-draft (the target without ``--skip`` layers; ``--self-rows`` rows per domain, it is
  slow). Replayed: each drafter driven over the row as the engine drives it (exact for
  greedy rows: the target's choices are the row's own tokens).
- D2 throughput: the tree engine with the head, with n-gram trees and plain (K=0) on the
  held-out prompts at each batch size, in the order plain, n-gram, head, head, n-gram, plain
  (ABBA: the machine's drift cancels in the ratios); every row checked identical to plain;
  the head engine's step split into drafting and verifying, and the head's forward per depth
  beside the target's one-row forward.

    .venv/bin/batchspec run jobs/synth_tree.yaml --output /tmp/d23/out
    .venv/bin/batchspec distill jobs/synth_tree.yaml --output /tmp/d23/out
    .venv/bin/python scripts/bench/distill.py --output /tmp/d23/out --batches 1,8,16

The last line: ``head: mean tokens per verify step X at 8 nodes (n-gram trees Y), tree engine
with head / plain: Z at batch 1``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402
from harness import abba, header  # noqa: E402
from tree_lib import Run, Sample, per_step, run, variant  # noqa: E402

from batchspec.engines.tree.drafter import ModelDrafter, growth_scratch  # noqa: E402
from batchspec.engines.tree.drafting import Drafter, replay  # noqa: E402
from batchspec.engines.tree.eagle import EagleDrafter, StoredFeatures  # noqa: E402
from batchspec.engines.tree.eagle_head import TappedModel, load_head  # noqa: E402
from batchspec.engines.tree.hybrid import NgramFirst  # noqa: E402
from batchspec.engines.tree.ngram import NgramDrafter  # noqa: E402
from batchspec.io.layout import OutDir  # noqa: E402
from batchspec.measure.distill import load_target, split  # noqa: E402
from batchspec.measure.distill_data import Row, committed_rows  # noqa: E402
from batchspec.spec.file import load_spec  # noqa: E402
from batchspec.spec.tree import TreeShape  # noqa: E402
from batchspec.units import RowRequest, WorkUnit  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    ap.add_argument("--output", required=True, help="the job's output directory")
    ap.add_argument("--head", help="the head [default: OUTPUT/drafts/eagle3]")
    ap.add_argument("--holdout", type=float, default=0.1, help="as distill was run")
    ap.add_argument("--depth", type=int, default=6, help="deepest draft node")
    ap.add_argument("--skip", default="10,12,14,16,18,20", help="layers the self-draft skips")
    ap.add_argument("--self-rows", type=int, default=2, help="self-draft rows per domain")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--rows", type=int, default=16, help="held-out prompts run per batch size")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--lookup", default="1,4", help="n-gram bounds, min,max (every n-gram draft)")
    return ap.parse_args()


def overrides(a: argparse.Namespace) -> list[str]:
    """The job as benchmarked: its n-gram bounds (``--lookup``), max_tokens, output last."""
    lo, hi = a.lookup.split(",")
    return [
        f"speculative.prompt_lookup_min={lo}",
        f"speculative.prompt_lookup_max={hi}",
        f"sampling.max_tokens={a.max_tokens}",
        f"output.dir={a.output}",
    ]


def d1(a: argparse.Namespace, held: list[Row], head_dir: Path, spec) -> dict[int, dict]:
    """Tokens per verify step per domain and node count, for each drafter."""
    target = load_target(spec)
    layers = target.cfg.num_hidden_layers
    keep = [i for i in range(layers) if i not in {int(x) for x in a.skip.split(",") if x}]
    head = load_head(head_dir, target)
    tapped = TappedModel.of(target, head.cfg.aux_layers)
    shape = TreeShape(max_depth=a.depth)
    out: dict[int, dict] = {}
    for k in (4, 8):
        sums: dict[tuple[str, str], list[int]] = {}
        seen: dict[str, int] = {}
        scratch = growth_scratch(k, a.depth)  # the nodes a tree's growth feeds behind a row
        lookup = (spec.speculative.prompt_lookup_min, spec.speculative.prompt_lookup_max)
        for r in held:
            dom = str(r.domain)
            seen[dom] = seen.get(dom, 0) + 1
            tapped.prefill(0, r.tokens)
            feats = tapped.take(0)
            tapped.release(0)
            room = len(r.tokens) + scratch
            drafters: dict[str, Drafter] = {
                "head": EagleDrafter(head, StoredFeatures(feats), 1, room),
                "ngram": NgramDrafter(*lookup),
                "hybrid": NgramFirst(
                    NgramDrafter(*lookup), EagleDrafter(head, StoredFeatures(feats), 1, room)
                ),
            }
            if seen[dom] <= a.self_rows:
                draft = target.layers_only(keep, 1, len(r.tokens) + scratch)
                drafters["self"] = ModelDrafter(draft, target.vocab_size)
            for name, drafter in drafters.items():
                got = replay(drafter, r.prompt, r.output, k, shape, len(r.output) + 1)
                emitted, steps = sum(got.accepted) + len(got.accepted), len(got.accepted)
                plain = len(r.output) - 1 - emitted  # steps that drafted nothing: plain ones
                s = sums.setdefault((dom, name), [0, 0, 0, 0])
                for i, v in enumerate((emitted, steps, len(r.output) - 1, steps + plain)):
                    s[i] += v
        out[k] = {key: v[0] / v[1] if v[1] else float("nan") for key, v in sums.items()}
        out[-k] = {key: v[2] / v[3] if v[3] else float("nan") for key, v in sums.items()}
    return out


def print_d1(both: dict[int, dict]) -> dict[int, dict[str, float]]:
    """Per verify step that drafted (the issue's D1), then per target forward (every step:
    one that drafts nothing is a plain step, which flatters a drafter that often has none
    in the first table, as n-gram trees do); returns the first's means per K."""
    doms = sorted({d for v in both.values() for d, _ in v})
    titles = {1: "tokens per verify step", -1: "tokens per target forward (every step)"}
    means = {}
    for sign, title in titles.items():
        res = {k: v for k, v in both.items() if k * sign > 0}
        print(f"\nD1: {title} on held-out rows (replayed)")
        print(f"{'domain':<13}" + "".join(f"{f'{n}@{abs(k)}':>10}" for k in res for n in DRAFTS))
        for d in doms:
            cells = [res[k].get((d, n), float("nan")) for k in res for n in DRAFTS]
            print(f"{d:<13}" + "".join(f"{c:>10.2f}" for c in cells))
        got = {k: {n: mean([v.get((d, n)) for d in doms]) for n in DRAFTS} for k, v in res.items()}
        print(f"{'mean':<13}" + "".join(f"{got[k][n]:>10.2f}" for k in res for n in DRAFTS))
        means[sign] = {abs(k): v for k, v in got.items()}
    return means[1]


DRAFTS = ("head", "ngram", "hybrid", "self")
"""``hybrid``: n-gram trees where the trie continues the row, the head's elsewhere
(``tree.ngram_first``)."""


def mean(values: list[float | None]) -> float:
    got = [v for v in values if v is not None and v == v]
    return statistics.mean(got) if got else float("nan")


def timed_run(label: str, spec, k: int, smp: Sample) -> tuple[Run, dict[str, float]]:
    """``run`` with the head engine's drafting and verifying timed apart."""
    from batchspec.engines import open_engine

    parts = {"draft": 0.0, "verify": 0.0}
    real_open = open_engine

    def instrumented(*args, **kw):
        eng = real_open(*args, **kw)
        for obj, name, key in ((eng.drafter, "draft", "draft"), (eng.model, "verify", "verify")):
            if obj is None:
                continue
            fn = getattr(obj, name)

            def wrap(*a, _fn=fn, _key=key, **k):
                t = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:
                    parts[_key] += time.perf_counter() - t

            setattr(obj, name, wrap)
        return eng

    import tree_lib

    tree_lib.open_engine = instrumented
    try:
        return run(label, spec, k, smp), parts
    finally:
        tree_lib.open_engine = real_open


def d2(a: argparse.Namespace, held: list[Row], head_dir: Path, spec) -> dict[int, float]:
    """Tokens/s of plain, n-gram and head trees per batch size; head / plain per batch."""
    rows = held[: a.rows]
    reqs = [RowRequest(i, r.row_id, r.domain, {}, r.prompt) for i, r in enumerate(rows)]
    smp = Sample(WorkUnit(0, "held-out", 0, len(reqs), None, len(reqs)), reqs, [])
    ratios = {}
    for batch in [int(b) for b in a.batches.split(",")]:
        tree = {"max_depth": a.depth}
        plain_s = variant(spec, batch, tree)
        ngram_s = variant(load_spec(a.job, overrides(a)[:-1]), batch, tree)
        head_upd = {"method": "eagle3", "model": str(head_dir)}
        head_s = plain_s.model_copy(
            update={"speculative": plain_s.speculative.model_copy(update=head_upd)}
        )
        hybrid_tree = head_s.speculative.tree.model_copy(update={"ngram_first": True})
        hybrid_s = head_s.model_copy(
            update={"speculative": head_s.speculative.model_copy(update={"tree": hybrid_tree})}
        )
        configs = {"plain": (plain_s, 0), "ngram": (ngram_s, 4), "head": (head_s, 4),
                   "hybrid": (hybrid_s, 4)}  # fmt: skip
        ref: list[Run] = []

        def one(label: str, r: int, configs=configs, ref=ref) -> tuple[Run, dict[str, float]]:
            got = timed_run(label, *configs[label], smp)
            ref[:] = ref or [got[0]]  # the first run: every other's identity is against it
            return got

        def show(label: str, got: tuple[Run, dict[str, float]], batch=batch, ref=ref) -> str:
            r, parts = got
            same = sum(x.token_ids == y.token_ids
                       for x, y in zip(ref[0].results, r.results, strict=True))  # fmt: skip
            split_s = ", ".join(f"{p} {v:.1f} s" for p, v in parts.items())
            return (
                f"batch {batch:>2} {r.rate:7.1f} tok/s  {per_step(r.results):.2f} tokens/step"
                f"  identical {same}/{len(r.results)}  ({split_s} of {r.seconds:.1f} s)"
            )

        runs = abba(list(configs), 2, one, show)
        got = {label: [r.rate for r, _ in rs] for label, rs in runs.items()}
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

    def best(fn) -> float:
        times = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times) * 1e3

    hid = torch.zeros(1, 1, head.fc.shape[0])
    mask = torch.ones(1, 1, 1, dtype=torch.bool)
    h_ms = best(lambda: drafter._run([0], one, hid, one * 3, mask, None))
    lp_ms = best(lambda: drafter._logprobs(hid[0]))
    t_ms = best(lambda: tapped.verify([0], one, one * 64, mask))
    tapped.release(0)
    plain = load_target(spec)
    compiled = plain.use_one_row_kernel()
    plain.prefill(0, list(range(100, 164)))
    c_ms = best(lambda: plain.verify([0], one, one * 64, mask))
    vocab = head.cfg.draft_vocab
    print(f"\nhead forward per depth {h_ms + lp_ms:.2f} ms (layer {h_ms:.2f}, projection onto "
          f"{vocab} tokens {lp_ms:.2f}); target one-row forward {t_ms:.2f} ms eager, "
          f"{c_ms:.2f} ms {'compiled' if compiled else 'eager (no compiler)'}")  # fmt: skip


def main() -> None:
    a = parse()
    header()
    spec = load_spec(a.job, overrides(a))
    head_dir = Path(a.head or Path(a.output) / "drafts" / "eagle3")
    rows, _ = committed_rows(spec, OutDir(spec.output_dir), None)
    _, held = split(rows, a.holdout)
    print(f"{len(held)} held-out rows of {len(rows)}; head {head_dir}", flush=True)
    means = print_d1(d1(a, held, head_dir, spec))
    per_depth(head_dir, spec)
    ratios = d2(a, held, head_dir, spec)
    z = ratios.get(1, float("nan"))
    x, y = means[8]["head"], means[8]["ngram"]
    print(f"head: mean tokens per verify step {x:.2f} at 8 nodes (n-gram trees {y:.2f}), "
          f"tree engine with head / plain: {z:.2f} at batch 1 (n-gram first: "
          f"{ratios.get(-1, float('nan')):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
