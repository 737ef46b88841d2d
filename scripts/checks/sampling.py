"""Issue 24's targets on both engines, on the embedded model in float32, through the CLI:

- rows: ``batchspec run`` of a job with ``n: 4``, repetition/frequency/presence penalties,
  ``min_tokens`` and ``logprobs: k`` (k = 1 and 20), greedy, with speculation and with K = 0:
  every (id, sample_index) row must have the same tokens, and every generated token's top-k
  log-probabilities the same token ids and values within 1e-4 nats;
- verify: ``batchspec verify`` of the same job, greedy (float32 identity) and sampled
  (two-sample test), each expected to pass, and with the planted bias (every draft accepted,
  ``engines.planted``) expected to fail.

    .venv/bin/python scripts/checks/sampling.py                 # both engines, everything
    .venv/bin/python scripts/checks/sampling.py --only tree --rows 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import yaml

from batchspec.io.layout import OutDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import ROOT, cli

SAMPLING = {
    "n": 4,
    "repetition_penalty": 1.15,
    "frequency_penalty": 0.6,
    "presence_penalty": 0.3,
    "min_tokens": 16,
}
ENGINES = {
    "vllm": ("synth_data.yaml", {"method": "ngram", "num_speculative_tokens": 3}),
    "tree": ("synth_tree.yaml", {"method": "ngram", "num_speculative_tokens": 4}),
}
BIAS = {"BATCHSPEC_INJECT_ACCEPT_ALL": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
TOLERANCE = 1e-4


def balanced_input(tmp: Path, rows: int, domains: list[str] | None = None) -> Path:
    """``rows`` prompts of the default set's ``domains`` (default: all), as even over them as
    they go (the first rows of each): chat alone, ``--limit``'s first rows, drafts little
    under penalties."""
    prompts = pl.read_parquet(ROOT / "jobs" / "data" / "prompts.parquet")
    if domains:
        prompts = prompts.filter(pl.col("domain").is_in(domains))
    ranked = prompts.with_columns(pl.int_range(pl.len()).over("domain").alias("_rank"))
    picked = ranked.sort("_rank", "domain").head(rows).drop("_rank")
    path = tmp / ("input.parquet" if domains is None else "sampled.parquet")
    picked.write_parquet(path)
    return path


def write_job(
    tmp: Path, engine: str, name: str, k: int | None, sampling: dict, data: str = "input"
) -> Path:
    """The engine's shipped job with this check's sampling, K (None: the job's) and output."""
    base, spec = ENGINES[engine]
    job = yaml.safe_load((ROOT / "jobs" / base).read_text())
    job["input"]["path"] = str(tmp / f"{data}.parquet")
    job["output"]["dir"] = str(tmp / name)
    job["model"]["dtype"] = "float32"
    job["speculative"].update(spec)
    job["speculative"].pop("k_grid", None)  # one fixed K: the comparison's
    if k is not None:
        job["speculative"]["num_speculative_tokens"] = k
        if k == 0 and engine == "vllm":  # the tree engine's K = 0 is its plain decoding
            job["speculative"] = {"method": "none"}
    job["sampling"].update(SAMPLING | sampling)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def rows_of(job: Path) -> pl.DataFrame:
    out = OutDir(Path(yaml.safe_load(job.read_text())["output"]["dir"]))
    return pl.read_parquet(out.part_files()).sort("id", "sample_index")


def compare_rows(tmp: Path, engine: str, k_top: int, args: argparse.Namespace) -> str:
    """Plain and speculative runs of the same rows: tokens and logprobs, row by row."""
    frames = []
    for k in (0, None):
        name = f"{engine}_rows_k{k_top}_{'plain' if k == 0 else 'spec'}"
        job = write_job(tmp, engine, name, k, {"max_tokens": args.max_tokens, "logprobs": k_top})
        proc, _ = cli("run", str(job), "--no-progress")
        if proc.returncode != 0:
            return f"{engine} rows k={k_top}: run exit {proc.returncode}\n{proc.stderr[-2000:]}"
        frames.append(rows_of(job))
    plain, spec = frames
    same_tokens = drift = 0.0
    bad_lp = 0
    for a, b in zip(plain.iter_rows(named=True), spec.iter_rows(named=True), strict=True):
        assert (a["id"], a["sample_index"]) == (b["id"], b["sample_index"])
        if a["generated_text"] != b["generated_text"] or len(a["logprobs"]) != len(b["logprobs"]):
            continue
        same_tokens += 1
        for pa, pb in zip(a["logprobs"], b["logprobs"], strict=True):
            da = {e["token_id"]: e["logprob"] for e in pa}
            db = {e["token_id"]: e["logprob"] for e in pb}
            if da.keys() != db.keys() or not k_top <= len(da) <= k_top + 1:
                bad_lp += 1
                continue
            drift = max(drift, max(abs(da[t] - db[t]) for t in da))
    accepted = int(spec["num_accepted_tokens"].sum())
    drafted = int(spec["num_draft_tokens"].sum())
    ok = same_tokens == len(plain) and bad_lp == 0 and drift < TOLERANCE and accepted > 0
    return (
        f"{engine} rows logprobs={k_top}: {int(same_tokens)}/{len(plain)} rows identical "
        f"({args.rows} prompts x n=4), positions with other top-k ids {bad_lp}, max logprob "
        f"drift {drift:.2g} nats, drafts accepted {accepted}/{drafted} -> "
        f"{'pass' if ok else 'FAIL'}"
    )


def verify(tmp: Path, engine: str, mode: str, planted: bool, args: argparse.Namespace) -> str:
    """One ``batchspec verify``; the planted bias expects exit 1, the rest exit 0."""
    name = f"{engine}_verify_{mode}{'_planted' if planted else ''}"
    temperature = 0.0 if mode == "greedy" else 1.0
    # Sampled: prompts that quote text, where n-gram drafts come within the tested tokens.
    data = "input" if mode == "greedy" else "sampled"
    job = write_job(tmp, engine, name, None, {"temperature": temperature}, data)
    if mode == "sampled":
        # vLLM's penalties apply to prompt tokens too, so a 2-token match with the prompt is
        # rare within the first tokens: one token, as the tree job has it, drafts at all.
        spec = yaml.safe_load(job.read_text())
        spec["speculative"]["prompt_lookup_min"] = args.sampled_lookup_min
        job.write_text(yaml.safe_dump(spec))
    rows = args.rows if mode == "greedy" else args.sampled_rows
    extra = ["--samples", str(args.samples), "--tokens", str(args.tokens)]
    extra += ["--set", f"sampling.max_tokens={args.max_tokens}"]
    started = time.time()
    proc, _ = cli("verify", str(job), "--rows", str(rows), *extra, env=BIAS if planted else None)
    took = time.time() - started
    expected = 1 if planted else 0
    out = Path(yaml.safe_load(job.read_text())["output"]["dir"])
    reports = sorted(out.glob("verify/report-*.json"))
    if not reports:
        return f"{name}: exit {proc.returncode}, no report\n{proc.stderr[-2000:]}"
    parts = []
    for c in json.loads(reports[-1].read_text())["checks"]:
        if c["check"] == "greedy":
            parts.append(
                f"{c['rows']} rows, {c['identical']} identical, {c['failures']} failures, "
                f"max drift {c['max_drift']}"
            )
        else:
            parts.append(
                f"{c['tests']} tests, {c['rejected']} rejected, min p Holm "
                f"{c['min_p_holm']:.3g}, max TV seen {c['max_tv_observed']:.3f}, detectable "
                f"TV {c['detectable_tv_max']:.3f}"
            )
    verdict = "as expected" if proc.returncode == expected else "UNEXPECTED"
    return f"{name}: exit {proc.returncode} ({verdict}) | {' | '.join(parts)} | {took:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(ENGINES), help="one engine")
    ap.add_argument("--rows", type=int, default=12, help="prompts (x n=4 rows), all domains")
    ap.add_argument("--sampled-rows", type=int, default=3, help="prompts sampled by verify")
    ap.add_argument(
        "--sampled-domains",
        default="translation,summarization,code",
        help="domains verify samples (penalties keep n-gram drafts off the first tokens of "
        "chat and math prompts: a planted bias there goes unseen)",
    )
    ap.add_argument(
        "--sampled-lookup-min",
        type=int,
        default=1,
        help="prompt_lookup_min of the sampled verify jobs (vLLM's job has 2)",
    )
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--skip-rows", action="store_true")
    ap.add_argument("--modes", default="greedy,sampled", help="verify's modes")
    args = ap.parse_args()
    print(f"sampling: {json.dumps(SAMPLING)}, float32, max_tokens {args.max_tokens}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        balanced_input(Path(tmp), args.rows)
        balanced_input(Path(tmp), args.sampled_rows, args.sampled_domains.split(","))
        for engine in [args.only] if args.only else list(ENGINES):
            for k_top in () if args.skip_rows else (1, 20):
                print(compare_rows(Path(tmp), engine, k_top, args), flush=True)
            if args.skip_verify:
                continue
            for mode in args.modes.split(","):
                for planted in (False, True):
                    print(verify(Path(tmp), engine, mode, planted, args), flush=True)


if __name__ == "__main__":
    main()
