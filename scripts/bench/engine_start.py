"""vLLM engine starts, side by side: the engine's processes forked (batchspec's default on the
CPU), spawned (vLLM's CPU default, ``VLLM_WORKER_MULTIPROC_METHOD=spawn``) and the engine in
the worker's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, what tests of the planted
bias use), each in a fresh interpreter, ABBA rounds. Measured: importing vLLM's ``LLM`` (paid
once per worker either way), building the engine and closing it, for the default job at K=3.

    .venv/bin/python scripts/bench/engine_start.py --rounds 3
"""

from __future__ import annotations

import os
import statistics
import time

from harness import abba, fresh, header, parser, ratio

SETTINGS = {
    "fork": {},
    "spawn": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
    "in-process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
}


def start(config: str, job: str, k: int) -> dict:
    """In a fresh interpreter: import, build and close one engine; seconds of each."""
    os.environ.update(SETTINGS[config])
    started = time.perf_counter()
    from vllm import LLM  # noqa: F401  (the import every start pays once per process)

    from batchspec.engines.vllm_engine import VllmEngine
    from batchspec.spec.file import load_spec

    imported = time.perf_counter()
    engine = VllmEngine(load_spec(job), k)
    built = time.perf_counter()
    engine.close()
    return {"import_s": imported - started, "build_s": built - imported,
            "close_s": time.perf_counter() - built}  # fmt: skip


def main() -> None:
    args = parser(__doc__, rounds=3, job="jobs/synth_data.yaml", k=3).parse_args()
    header()
    got = abba(list(SETTINGS), args.rounds, lambda c, _r: fresh(start, c, args.job, args.k),
               lambda _c, d: f"build {d['build_s']:.1f} s, close {d['close_s']:.1f} s")  # fmt: skip
    for config, runs in got.items():
        means = {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}
        print(f"{config:>10}: import {means['import_s']:.1f} s, build {means['build_s']:.1f} s"
              f" [{min(r['build_s'] for r in runs):.1f}-{max(r['build_s'] for r in runs):.1f}],"
              f" close {means['close_s']:.1f} s")  # fmt: skip
    build = {c: [r["build_s"] for r in runs] for c, runs in got.items()}
    print(
        f"vllm start: fork / spawn {ratio(build['fork'], build['spawn'])}, "
        f"fork / in-process {ratio(build['fork'], build['in-process'])}"
    )


if __name__ == "__main__":
    main()
