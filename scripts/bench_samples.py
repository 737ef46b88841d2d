"""n samples per prompt (``sampling.n``) against the same samples as separate input rows, on
the tree engine: output tokens/s and prompts prefilled (issue 24).

``n`` feeds a prompt's samples into the batch together, so every sample after the first finds
the prompt in a row in flight and copies its KV cache instead of computing it
(``TreeEngine.shared_prefills`` counts them). Copies of a prompt as separate rows of the
input sit apart (the input repeated ``n`` times): each is prefilled on its own. Both runs decode
the same requests (same prompts, same per-sample seeds) on one engine, in ABBA order; the
prefill share is what differs. The machine is noisy: compare the two within one run only.

    .venv/bin/python scripts/bench_samples.py                         # 3 prompts/domain, n=4
    .venv/bin/python scripts/bench_samples.py --per-domain 2 --n 4 --max-tokens 32 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]

from batchspec.engines import open_engine  # noqa: E402
from batchspec.io.inputs import row_seed  # noqa: E402
from batchspec.measure.verify import build_requests, pick_rows, run_rows  # noqa: E402
from batchspec.spec.file import load_spec  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    p.add_argument("--per-domain", type=int, default=3)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    sets = [
        f"sampling.max_tokens={a.max_tokens}",
        f"sampling.temperature={a.temperature}",
        "sampling.seed=1",
        f"model.max_num_seqs={a.batch}",
    ]
    spec = load_spec(Path(a.job), sets)
    units, quota, tok = pick_rows(spec, a.per_domain * 6)
    base = build_requests(spec, units, quota, tok, spec.model.max_model_len or 2048)
    seeds = {r.row_id: [row_seed(1, 0, r.row, j) for j in range(a.n)] for r in base}
    together = [
        replace(r, sample_index=j, seed=seeds[r.row_id][j]) for r in base for j in range(a.n)
    ]
    apart = [
        replace(r, row_id=f"{r.row_id}#{j}", seed=seeds[r.row_id][j])
        for j in range(a.n)
        for r in base
    ]
    k = spec.speculative.num_speculative_tokens
    engine = open_engine(spec, k)
    print(f"{len(base)} prompts x n={a.n}, K={k}, batch {a.batch}, T={a.temperature}, "
          f"{a.max_tokens} tokens; engine built in {engine.build_s:.1f} s")  # fmt: skip
    rates: dict[str, list[float]] = {"n (together)": [], "copies (apart)": []}
    shared: dict[str, int] = {}
    order = [("n (together)", together), ("copies (apart)", apart)]
    try:
        for rnd in range(a.rounds):
            for label, rows in order if rnd % 2 == 0 else order[::-1]:
                before = engine.shared_prefills
                started = time.perf_counter()
                results = run_rows(engine, units[0], rows)
                seconds = time.perf_counter() - started
                tokens = sum(r.num_output_tokens or 0 for r in results)
                rates[label].append(tokens / seconds)
                shared[label] = engine.shared_prefills - before
                print(f"  round {rnd + 1} {label}: {tokens} tokens in {seconds:.1f} s, "
                      f"{tokens / seconds:.1f} tok/s, {len(rows) - shared[label]} of "
                      f"{len(rows)} prompts prefilled")  # fmt: skip
    finally:
        engine.close()
    for label, r in rates.items():
        print(
            f"{label}: mean {sum(r) / len(r):.1f} tok/s; prefills {len(together) - shared[label]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
