"""Draft-model trees against draft-model chains on the tree engine, in one run (issue 13's T3
with draft source (b), and T1 for every run). Embedded model, float32, greedy, CPU.

The draft is the target itself with some decoder layers skipped (``tree.draft_layers``:
self-speculation as in LayerSkip and Draft & Verify), the only draft model at hand offline.
For each K it runs a K-node chain (``branching: [1] * K``) and a K-node dynamic tree (EAGLE-2:
the K candidates of highest cumulative draft probability, top-ranked children per node) from
the same draft, and prints

- mean tokens per verify step (1 + accepted / steps), per domain and overall, and tree / chain
  (target: >= 1.25 at K=8);
- T1: rows token-identical to the same engine's plain decoding (K=0);
- output tokens/s of every run against plain decoding, one pass each (the draft costs
  ``len(draft_layers) / layers`` of a target forward per depth, so on this CPU it does not pay;
  the figure says by how much).

    .venv/bin/python scripts/bench/tree_draft.py                    # 2 prompts/domain, 64 tokens
    .venv/bin/python scripts/bench/tree_draft.py --ks 4,8 --rows 4 --skip 10,12,14,16,18,20
"""

from __future__ import annotations

import argparse
import sys

from harness import JOBS, header, ints, options, parser
from tree_lib import Run, identical, run, sample, variant, versus, versus_header

from batchspec.spec.file import load_spec


def parse() -> argparse.Namespace:
    """--rows: prompts per domain; --ks: draft nodes per step; --skip: target layers the
    draft skips."""
    ap = parser(__doc__, job=str(JOBS / "synth_tree.yaml"), rows=2, max_tokens=64, ks="4,8")
    return options(ap, skip="10,12,14,16,18,20").parse_args()


def main() -> None:
    a = parse()
    header()
    # A placeholder draft to pass validation; every run below sets its own layers.
    sets = ["speculative.method=draft_model", "speculative.tree.draft_layers=[0]"]
    spec = load_spec(a.job, [f"sampling.max_tokens={a.max_tokens}", *sets])
    layers_total = spec_layers(spec)
    skip = set(ints(a.skip))
    layers = [i for i in range(layers_total) if i not in skip]
    smp = sample(spec, a.rows)
    batch = len(smp.rows)
    print(f"draft: the target's layers except {sorted(skip)} ({len(layers)} of {layers_total});"
          f" {batch} prompts ({a.rows} per domain), {a.max_tokens} tokens, batch {batch}",
          flush=True)  # fmt: skip

    def go(label: str, k: int, shape: dict) -> Run:
        r = run(label, variant(spec, batch, {**shape, "draft_layers": layers}), k, smp)
        print(f"  {label}: {r.tokens} tokens in {r.seconds:.1f} s ({r.rate:.1f} tok/s)",
              flush=True)  # fmt: skip
        return r

    plain = go("plain K=0", 0, {"max_depth": 1})
    runs: dict[tuple[int, str], Run] = {}
    for k in ints(a.ks):
        runs[k, "chain"] = go(f"chain [1]*{k}", k, {"branching": [1] * k, "max_depth": k})
        runs[k, "tree"] = go(f"tree {k} nodes", k, {"max_depth": k})
    report(smp.domains, plain, runs)


def spec_layers(spec) -> int:
    import json

    from batchspec.models import resolve_model

    d = resolve_model(spec.model.model, "model.model", spec.resolve("."), auto_prepare=True)
    return int(json.loads((d / "config.json").read_text())["num_hidden_layers"])


def report(doms: list[str], plain: Run, runs: dict[tuple[int, str], Run]) -> None:
    """Tokens per verify step, trees against chains; every run's rows against plain decoding."""
    print("\nT3 draft-model trees vs chains: mean tokens per verify step (1 + accepted / steps)")
    print(versus_header(doms))
    for k in sorted({k for k, _ in runs}):
        print("\n".join(versus(doms, k, runs[k, "chain"].results, runs[k, "tree"].results)))
    print(f"target: tree / chain >= 1.25 at K=8; plain decoding {plain.rate:.1f} tok/s")
    for r in runs.values():
        same, _ = identical(plain.results, r.results)
        print(
            f"  {r.label}: identical to plain {same}/{len(r.results)}, tok/s / plain "
            f"{r.rate / plain.rate:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
