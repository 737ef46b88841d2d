"""vLLM engine layouts on the CPU, side by side, each in a fresh interpreter, ABBA rounds:

- core: batchspec's default (``engines/vllm_fork.py``): the engine core forked from the
  worker, the model computed in it;
- core+worker: the core forked, the model in a worker process vLLM spawns beside it (vLLM's
  CPU layout; a job gets it with ``model.engine_kwargs.distributed_executor_backend: mp``);
- spawn: every engine process spawned (vLLM's CPU default, ``VLLM_WORKER_MULTIPROC_METHOD``);
- in-process: the engine in the worker's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; no
  hang or crash of the engine can be survived: the tests of outputs use it).

Measured: importing vLLM's ``LLM`` (paid once per worker either way), building the engine,
then vLLM's own generation of the job's first ``--rows`` prompts (its sampling, greedy) in
output tokens/s, and closing it; the tokens must be the same in every layout.

    .venv/bin/python scripts/bench/engine_start.py --rounds 2
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time

from harness import ROOT, abba, fresh, header, parser, ratio

LAYOUTS = {
    "core": ({}, []),
    "core+worker": ({}, ["model.engine_kwargs.distributed_executor_backend=mp"]),
    "spawn": ({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, []),
    "in-process": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, []),
}


def start(layout: str, job: str, k: int, rows: int) -> dict:
    """In a fresh interpreter: import, build, generate with and close one engine."""
    env, overrides = LAYOUTS[layout]
    os.environ.update(env)
    started = time.perf_counter()
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams  # noqa: F401  (the import every start pays once)

    from batchspec.engines.vllm_engine import VllmEngine
    from batchspec.spec.file import load_spec

    imported = time.perf_counter()
    spec = load_spec(job, overrides)
    engine = VllmEngine(spec, k)
    built = time.perf_counter()
    table = pq.read_table(spec.resolve(spec.input.path), columns=[spec.input.messages_column])
    chats = table.column(0).to_pylist()[:rows]
    params = SamplingParams(temperature=0.0, max_tokens=spec.sampling.max_tokens)
    outs = engine.llm.chat(chats, params, use_tqdm=False) if rows else []
    generated = time.perf_counter()
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    engine.close()
    return {"import_s": imported - started, "build_s": built - imported,
            "tok_s": sum(map(len, tokens)) / (generated - built) if rows else 0.0,
            "close_s": time.perf_counter() - generated,
            "tokens": hashlib.sha256(repr(tokens).encode()).hexdigest()[:12]}  # fmt: skip


def main() -> None:
    args = parser(__doc__, rounds=2, job=str(ROOT / "jobs/synth_data.yaml"), k=3, rows=32,
                  layouts=",".join(LAYOUTS)).parse_args()  # fmt: skip
    header()
    layouts = args.layouts.split(",")
    got = abba(layouts, args.rounds, lambda c, _r: fresh(start, c, args.job, args.k, args.rows),
               lambda _c, d: f"build {d['build_s']:.1f} s, {d['tok_s']:.1f} tok/s, "
                             f"close {d['close_s']:.1f} s")  # fmt: skip
    for layout, runs in got.items():
        mean = {key: statistics.fmean(r[key] for r in runs) for key in runs[0] if key != "tokens"}
        print(f"{layout:>11}: import {mean['import_s']:.1f} s, build {mean['build_s']:.1f} s"
              f" [{min(r['build_s'] for r in runs):.1f}-{max(r['build_s'] for r in runs):.1f}],"
              f" generation {mean['tok_s']:.1f} tok/s, close {mean['close_s']:.1f} s")  # fmt: skip
    same = len({r["tokens"] for runs in got.values() for r in runs}) == 1
    print(f"tokens: {'the same in every run' if same else 'DIFFER between runs'}")
    build = {c: [r["build_s"] for r in runs] for c, runs in got.items()}
    speed = {c: [r["tok_s"] for r in runs] for c, runs in got.items()}
    base = layouts[0]
    for other in layouts[1:]:
        print(
            f"vllm {base} / {other}: build {ratio(build[base], build[other])}"
            + (f", generation {ratio(speed[base], speed[other])}" if args.rows else "")
        )


if __name__ == "__main__":
    main()
