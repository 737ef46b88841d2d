"""Does ``speculative.engine: auto`` pick the faster engine? Both engines, side by side.

``batchspec tune`` on an ``auto`` job predicts, per batch size, each engine's output tokens/s
on the job's rows and routes the job to the faster one. This script checks that prediction
against real runs: at every batch size the tuning file routes, it runs the same rows through
``batchspec run``'s code path on the tree engine and on vLLM (each with the tuning file, so
each starts from its own tuned K per domain and keeps adapting), in ``--rounds`` interleaved
rounds with the order reversed every other round (ABBA), and prints each engine's tokens/s,
the routed engine's ratio to the other, and whether the route was right. Engine starts and
shutdowns are excluded; everything else counts.

    .venv/bin/batchspec tune jobs/synth_tree.yaml --output /tmp/auto \\
        --set speculative.engine=auto --set speculative.k_grid=[0,2,4] \\
        --set sampling.max_tokens=64 --batch 1,8 --sample 4
    .venv/bin/python scripts/bench_route.py --tuning /tmp/auto/tuning.json --max-tokens 64 \\
        --set speculative.k_grid=[0,2,4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def subset(spec, per_domain: int, path: Path) -> int:
    """The first ``per_domain`` rows of every domain, written to ``path``; how many."""
    df = pl.concat([pl.read_parquet(f) for f in spec.input_files()])
    dom = spec.input.domain_column
    df = df.group_by(dom, maintain_order=True).head(per_domain).sort(dom, spec.input.id_column)
    df.write_parquet(path)
    return df.height


def timed_run(spec, out: Path, tuning: Path, engine: str, batch: int) -> tuple[float, int]:
    """One run of the job on ``engine`` at ``batch`` into a fresh ``out`` holding the tuning
    file: (generation seconds, output tokens)."""
    from batchspec.speculation.route import with_engine
    from batchspec.work.worker import run_job

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(tuning, out / "tuning.json")
    run = with_engine(spec, engine).model_copy(
        update={
            "output": spec.output.model_copy(update={"dir": str(out)}),
            "model": spec.model.model_copy(update={"max_num_seqs": batch}),
        }
    )
    stats = run_job(run, progress=False)
    return stats.wall_s - stats.engine_build_s - stats.engine_close_s, stats.output_tokens


def bench_batch(spec, tmp: Path, tuning: Path, route: dict, rounds: int) -> str:
    """Both engines at one batch size, ABBA; the table row."""
    batch, routed = route["batch"], route["engine"]
    rates: dict[str, list[float]] = {"tree": [], "vllm": []}
    for r in range(rounds):
        order = ["tree", "vllm"] if r % 2 == 0 else ["vllm", "tree"]
        for engine in order:
            seconds, tokens = timed_run(spec, tmp / f"b{batch}-{engine}", tuning, engine, batch)
            rates[engine].append(tokens / seconds)
            print(
                f"  batch {batch} round {r + 1} {engine}: {tokens / seconds:.1f} tok/s", flush=True
            )
    other = "vllm" if routed == "tree" else "tree"
    mean = {e: statistics.mean(v) for e, v in rates.items()}
    each = ", ".join(f"{a / b:.3f}" for a, b in zip(rates[routed], rates[other], strict=True))
    ratio = mean[routed] / mean[other]
    predicted = route["tokens_per_s"]
    return (
        f"| {batch} | {routed} | {mean['tree']:.1f} ({predicted['tree']:.1f}) | "
        f"{mean['vllm']:.1f} ({predicted['vllm']:.1f}) | {ratio:.3f} (rounds {each}) | "
        f"{'yes' if ratio >= 1 else 'NO'} |"
    )


def main() -> None:
    import json

    from batchspec.spec.file import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    ap.add_argument("--tuning", type=Path, required=True, help="tune's file for the auto job")
    ap.add_argument("--per-domain", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64, help="as the job was tuned with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="as given to tune")
    args = ap.parse_args()
    routes = json.loads(args.tuning.read_text())["route"]
    with tempfile.TemporaryDirectory(prefix="bench-route-") as name:
        tmp = Path(name)
        base = load_spec(args.job)
        rows = subset(base, args.per_domain, tmp / "in.parquet")
        sets = [f"input.path={tmp / 'in.parquet'}", f"sampling.max_tokens={args.max_tokens}"]
        sets += args.sets
        spec = load_spec(args.job, [*sets, "speculative.engine=auto"])
        print(
            f"{rows} prompts x {args.max_tokens} tokens, {spec.model.dtype}, "
            f"{args.rounds} rounds (ABBA); each engine from the tuning file's K, adapting",
            flush=True,
        )
        # One-off costs of the first run in a process (imports, allocator growth): unmeasured.
        timed_run(spec, tmp / "warmup", args.tuning, "tree", routes[0]["batch"])
        lines = [bench_batch(spec, tmp, args.tuning, r, args.rounds) for r in routes]
    print("| batch | routed to | tree engine tok/s (predicted) | vLLM tok/s (predicted) | "
          "routed / other | right |")  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
