"""Does ``speculative.engine: auto`` pick the faster engine? At each batch size a tuning file
routes, the same rows through ``run_job`` on the tree engine and on vLLM (each from its tuned
K, adapting), ABBA rounds: each engine's tok/s, the routed one's ratio, whether it was right.

    .venv/bin/batchspec tune jobs/synth_tree.yaml --output /tmp/auto \\
        --set speculative.engine=auto --set speculative.k_grid=[0,2,4] \\
        --set sampling.max_tokens=64 --batch 1,8 --sample 4
    .venv/bin/python scripts/bench/route.py --tuning /tmp/auto/tuning.json --max-tokens 64 \\
        --set speculative.k_grid=[0,2,4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from harness import ROOT, abba, balanced, header, ratio, run_here


def run_on(spec, out: Path, tuning: Path, engine: str, batch: int) -> dict:
    """One run of the job on ``engine`` at ``batch`` into a fresh ``out`` holding the tuning."""
    from batchspec.speculation.route import with_engine

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(tuning, out / "tuning.json")
    return run_here(with_engine(spec, engine), out, batch)


def bench_batch(spec, tmp: Path, tuning: Path, route: dict, rounds: int) -> str:
    """Both engines at one batch size, ABBA; the table row."""
    batch, routed = route["batch"], route["engine"]
    got = abba(["tree", "vllm"], rounds,
               lambda e, r: run_on(spec, tmp / f"b{batch}-{e}", tuning, e, batch),
               lambda e, g: f"batch {batch}: {g['tok_s']:.1f} tok/s")  # fmt: skip
    rates = {e: [g["tok_s"] for g in got[e]] for e in got}
    other = "vllm" if routed == "tree" else "tree"
    mean, predicted = {e: statistics.mean(v) for e, v in rates.items()}, route["tokens_per_s"]
    right = mean[routed] >= mean[other]
    return (f"| {batch} | {routed} | {mean['tree']:.1f} ({predicted['tree']:.1f}) | "
            f"{mean['vllm']:.1f} ({predicted['vllm']:.1f}) | {ratio(rates[routed], rates[other])}"
            f" | {'yes' if right else 'NO'} |")  # fmt: skip


def main() -> None:
    from batchspec.spec.file import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_tree.yaml"))
    ap.add_argument("--tuning", type=Path, required=True, help="tune's file for the auto job")
    ap.add_argument("--per-domain", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64, help="as the job was tuned with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="as given to tune")
    args = ap.parse_args()
    header()
    routes = json.loads(args.tuning.read_text())["route"]
    with tempfile.TemporaryDirectory(prefix="bench-route-") as name:
        tmp = Path(name)
        rows = balanced(load_spec(args.job), tmp / "in.parquet", args.per_domain).height
        sets = [f"input.path={tmp / 'in.parquet'}", f"sampling.max_tokens={args.max_tokens}"]
        spec = load_spec(args.job, [*sets, *args.sets, "speculative.engine=auto"])
        print(f"{rows} prompts x {args.max_tokens} tokens, {spec.model.dtype}, {args.rounds} "
              "rounds (ABBA); each engine from the tuning file's K, adapting")  # fmt: skip
        # One-off costs of the first run in a process (imports, allocator growth): unmeasured.
        run_on(spec, tmp / "warmup", args.tuning, "tree", routes[0]["batch"])
        lines = [bench_batch(spec, tmp, args.tuning, r, args.rounds) for r in routes]
    print("| batch | routed to | tree engine tok/s (predicted) | vLLM tok/s (predicted) | "
          "routed / other [rounds] | right |")  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
