"""n samples per prompt (``sampling.n``) against the same samples as separate input rows, on
the tree engine: output tokens/s and prompts prefilled (issue 24).

``n`` feeds a prompt's samples into the batch together, so every sample after the first finds
the prompt in a row in flight and copies its KV cache instead of computing it
(``TreeEngine.shared_prefills`` counts them). Copies of a prompt as separate rows sit apart
(the input repeated ``n`` times): each is prefilled on its own. Both decode the same requests
(same prompts, same per-sample seeds) on one engine, in ABBA order; the prefill share is what
differs. The machine is noisy: compare the two within one run only.

    .venv/bin/python scripts/bench/samples.py                         # 3 prompts/domain, n=4
    .venv/bin/python scripts/bench/samples.py --per-domain 2 --n 4 --max-tokens 32 --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from harness import ROOT, abba, header, ratio


def main() -> int:
    from batchspec.engines import open_engine
    from batchspec.io.inputs import row_seed
    from batchspec.measure.verify import build_requests, pick_rows, run_rows
    from batchspec.spec.file import load_spec

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    p.add_argument("--per-domain", type=int, default=3)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    header()
    sets = [f"sampling.max_tokens={a.max_tokens}", f"sampling.temperature={a.temperature}",
            "sampling.seed=1", f"model.max_num_seqs={a.batch}"]  # fmt: skip
    spec = load_spec(a.job, sets)
    units, quota, tok = pick_rows(spec, a.per_domain * 6)
    base = build_requests(spec, units, quota, tok, spec.model.max_model_len or 2048)
    seeds = {r.row_id: [row_seed(1, 0, r.row, j) for j in range(a.n)] for r in base}
    rows = {
        "n (together)": [replace(r, sample_index=j, seed=seeds[r.row_id][j])
                         for r in base for j in range(a.n)],
        "copies (apart)": [replace(r, row_id=f"{r.row_id}#{j}", seed=seeds[r.row_id][j])
                           for j in range(a.n) for r in base],
    }  # fmt: skip
    k = spec.speculative.num_speculative_tokens
    engine = open_engine(spec, k)
    print(f"{len(base)} prompts x n={a.n}, K={k}, batch {a.batch}, T={a.temperature}, "
          f"{a.max_tokens} tokens; engine built in {engine.build_s:.1f} s")  # fmt: skip

    def run(label: str, r: int) -> dict:
        before, started = engine.shared_prefills, time.perf_counter()
        tokens = sum(x.num_output_tokens or 0 for x in run_rows(engine, units[0], rows[label]))
        seconds = time.perf_counter() - started
        prefilled = len(rows[label]) - (engine.shared_prefills - before)
        return {"tok_s": tokens / seconds, "tokens": tokens, "prefilled": prefilled}

    try:
        got = abba(list(rows), a.rounds, run,
                   lambda c, g: f"{g['tok_s']:.1f} tok/s ({g['tokens']} tokens), "
                   f"{g['prefilled']} of {len(rows[c])} prompts prefilled")  # fmt: skip
    finally:
        engine.close()
    for label, g in got.items():
        print(f"{label}: mean {statistics.fmean(x['tok_s'] for x in g):.1f} tok/s; prefills "
              f"{g[-1]['prefilled']}")  # fmt: skip
    rates = [[x["tok_s"] for x in got[c]] for c in rows]
    print(f"n together / copies apart: {ratio(*rates)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
