"""``batchspec verify`` in full on the default job: n-gram and draft-model speculation (the
target as its own draft), greedy in float32 and bfloat16 and sampled, each expected to pass,
and a planted broken sampler (every draft accepted, ``engines.planted``) in greedy and in
sampled mode, each expected to fail. Prints one line of figures per configuration.

    .venv/bin/python scripts/checks/verify.py     # 24 greedy rows; 3 prompts x 200 samples
    .venv/bin/python scripts/checks/verify.py --rows 12 --samples 100 --only ngram

The planted bias patches the CLI's own vLLM, so those runs keep the engine in the CLI's
process; the others run vLLM as production does (vLLM 0.32 in one process failed a bf16
engine start after a float32 one: "'_lib_fn_wrapper' object has no attribute 'get'").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import ROOT, cli

DRAFT = {"method": "draft_model", "model": "builtin:smollm2-135m-instruct"}
F32 = {"dtype": "float32"}
"""Not a sampling key: the model dtype of a configuration (default bfloat16)."""
BIAS = {"BATCHSPEC_INJECT_ACCEPT_ALL": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def configs(only: str | None) -> list[tuple[str, dict, dict, dict, int]]:
    """(name, speculative, sampling, extra env, expected exit code)."""
    greedy, sampled = {"temperature": 0.0}, {"temperature": 1.0}
    out = []
    for method, spec in (("ngram", {}), ("draft", DRAFT)):
        out += [
            (f"{method} greedy bf16", spec, greedy, {}, 0),
            (f"{method} sampled", spec, sampled, {}, 0),
        ]
    # float32: vLLM 0.32 in one process fails an engine start after one of another dtype.
    out += [
        ("ngram greedy planted", {}, greedy | F32, BIAS, 1),
        ("ngram sampled planted", {}, sampled | F32, BIAS, 1),
    ]
    return [c for c in out if only is None or c[0].startswith(only)]


def run(name: str, tmp: Path, spec: dict, sampling: dict, env: dict, args: argparse.Namespace):
    job = yaml.safe_load((ROOT / "jobs" / "synth_data.yaml").read_text())
    job["input"]["path"] = str(ROOT / "jobs" / "data" / "prompts.parquet")
    job["output"]["dir"] = str(tmp / name.replace(" ", "_"))
    sampling = dict(sampling)
    job["model"].update(dtype=sampling.pop("dtype", "bfloat16"), max_num_seqs=args.batch)
    job["speculative"].update(spec)
    job["sampling"].update(sampling, max_tokens=args.max_tokens)
    path = tmp / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(job))
    rows = args.rows if job["sampling"]["temperature"] == 0 else args.sampled_rows
    proc, took = cli("verify", str(path), "--rows", str(rows), "--samples", str(args.samples),
                     "--tokens", str(args.tokens), env=env)  # fmt: skip
    reports = sorted(Path(job["output"]["dir"]).glob("verify/report-*.json"))
    if not reports:
        print(f"{name}: exit {proc.returncode}, no report\n{proc.stderr[-2000:]}")
        return proc.returncode, None
    return proc.returncode, (json.loads(reports[-1].read_text()), took)


def line(name: str, rc: int, expected: int, report: dict, took: float) -> str:
    parts = [f"{name:24s} exit {rc} ({'as expected' if rc == expected else 'UNEXPECTED'})"]
    for c in report["checks"]:
        if c["check"] == "greedy":
            margins = f"margins {c['min_margin']}..{c['max_margin']}"
            parts.append(
                f"{c['dtype']}: {c['rows']} rows, {c['identical']} identical, "
                f"{c['near_ties']} near-ties, {c['failures']} failures, {margins}, "
                f"max drift {c['max_drift']}"
            )
        else:
            parts.append(
                f"{c['prompts']} prompts x {c['positions']} positions, {c['tests']} tests, "
                f"{c['rejected']} rejected, min p {c['min_p']:.3g} (Holm {c['min_p_holm']:.3g}), "
                f"max TV seen {c['max_tv_observed']:.3f}, detectable TV "
                f"{c['detectable_tv_median']:.3f} (median) / {c['detectable_tv_max']:.3f} (max)"
            )
    return " | ".join(parts) + f" | {took:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24, help="greedy rows compared")
    ap.add_argument("--sampled-rows", type=int, default=3, help="prompts sampled")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64, help="greedy rows' length")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--only", help="configurations whose name starts with this")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec, sampling, env, expected in configs(args.only):
            rc, got = run(name, Path(tmp), spec, sampling, env, args)
            if got is not None:
                print(line(name, rc, expected, *got), flush=True)


if __name__ == "__main__":
    main()
