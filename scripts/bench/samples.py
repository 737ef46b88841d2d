"""``sampling.n`` against the same samples as separate input rows, on the tree engine (issue
24): with ``n`` a prompt's samples join the batch together and all but the first copy its KV
cache; copies as separate rows sit apart and each prefills. Same requests, one engine, ABBA.

    .venv/bin/python scripts/bench/samples.py --per-domain 2 --n 4 --max-tokens 32 --rounds 1
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from harness import JOBS, abba, header, options, parser, ratio


def main() -> int:
    from batchspec.engines import open_engine
    from batchspec.io.inputs import row_seed
    from batchspec.measure.verify import build_requests, pick_rows, run_rows
    from batchspec.spec.file import load_spec

    p = parser(__doc__, job=str(JOBS / "synth_tree.yaml"), per_domain=3, n=4, max_tokens=48)
    a = options(p, temperature=0.8, batch=8, rounds=2).parse_args()
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
