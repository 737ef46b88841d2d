"""Issue 24's targets on both engines, on the embedded model in float32, through the CLI:

- rows: ``batchspec run`` of a job with ``n: 4``, repetition/frequency/presence penalties,
  ``min_tokens`` and ``logprobs: k`` (k = 1 and 20), greedy, with speculation and with K = 0:
  every (id, sample_index) row the same tokens, every generated token's top-k log-probabilities
  the same token ids and values within 1e-4 nats;
- verify: ``batchspec verify`` of the same job, greedy and sampled, each expected to pass, and
  with the planted bias (every draft accepted, ``engines.planted``) expected to fail.

    .venv/bin/python scripts/checks/sampling.py                 # both engines, everything
    .venv/bin/python scripts/checks/sampling.py --only tree --rows 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import PLANTED, flags, job_file, options, parser, parts, run_cli, verify

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
TOLERANCE = 1e-4


def write_job(tmp: Path, engine: str, name: str, rows: dict, k: int | None, **sampling) -> Path:
    """The engine's shipped job with this check's sampling, the default set's ``rows``
    (``harness.balanced``'s arguments), K (None: the job's; vLLM's K = 0 is method none, the
    tree engine's its plain decoding), no ``k_grid`` (one fixed K: the comparison's) and its
    output under ``tmp``; ``lookup_min`` in ``sampling`` sets the prompt lookup's lower
    bound."""
    base, spec = ENGINES[engine]
    spec = spec | {"k_grid": None}
    if "lookup_min" in sampling:
        spec["prompt_lookup_min"] = sampling.pop("lookup_min")
    if k is not None:
        spec["num_speculative_tokens"] = k
    if k == 0 and engine == "vllm":
        spec = dict.fromkeys(["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"])
        spec |= {"method": "none", "k_grid": None}
    return job_file(
        tmp / f"{name}.yaml",
        base,
        rows,
        output={"dir": str(tmp / name)},
        model={"dtype": "float32"},
        speculative=spec,
        sampling=SAMPLING | sampling,
    )


def logprob_drift(plain: pl.DataFrame, spec: pl.DataFrame, k_top: int) -> tuple[int, int, float]:
    """Rows with the same text, positions whose top-k token ids differ, the largest
    log-probability difference over the positions that agree."""
    same = bad = 0
    drift = 0.0
    for a, b in zip(plain.iter_rows(named=True), spec.iter_rows(named=True), strict=True):
        assert (a["id"], a["sample_index"]) == (b["id"], b["sample_index"])
        if a["generated_text"] != b["generated_text"] or len(a["logprobs"]) != len(b["logprobs"]):
            continue
        same += 1
        for pa, pb in zip(a["logprobs"], b["logprobs"], strict=True):
            da = {e["token_id"]: e["logprob"] for e in pa}
            db = {e["token_id"]: e["logprob"] for e in pb}
            if da.keys() != db.keys() or not k_top <= len(da) <= k_top + 1:
                bad += 1
            else:
                drift = max(drift, max(abs(da[t] - db[t]) for t in da))
    return same, bad, drift


def compare_rows(tmp: Path, engine: str, k_top: int, args: argparse.Namespace) -> str:
    """Plain and speculative runs of the same rows: tokens and logprobs, row by row."""
    frames = []
    for k in (0, None):
        name = f"{engine}_rows_k{k_top}_{'plain' if k == 0 else 'spec'}"
        rows = {"rows": args.rows}
        job = write_job(tmp, engine, name, rows, k, max_tokens=args.max_tokens, logprobs=k_top)
        got = run_cli(job, tmp / name, check=False)
        if "exit" in got:
            return f"{engine} rows k={k_top}: run exit {got['exit']}: {got['error']}"
        frames.append(parts(tmp / name).sort("id", "sample_index"))
    plain, spec = frames
    same, bad, drift = logprob_drift(plain, spec, k_top)
    accepted, drafted = spec["num_accepted_tokens"].sum(), spec["num_draft_tokens"].sum()
    ok = same == len(plain) and bad == 0 and drift < TOLERANCE and accepted > 0
    return (
        f"{engine} rows logprobs={k_top}: {same}/{len(plain)} rows identical ({args.rows} "
        f"prompts x n=4), positions with other top-k ids {bad}, max logprob drift "
        f"{drift:.2g} nats, drafts accepted {accepted}/{drafted} -> {'pass' if ok else 'FAIL'}"
    )


def check_verify(tmp: Path, engine: str, mode: str, planted: bool, args) -> str:
    """One ``batchspec verify``; the planted bias expects exit 1, the rest exit 0. Sampled:
    prompts that quote text, and vLLM's prompt lookup from one token (its penalties apply to
    prompt tokens too, so a 2-token match with the prompt is rare within the first tokens)."""
    name = f"{engine}_verify_{mode}{'_planted' if planted else ''}"
    sampled = mode == "sampled"
    lookup = {"lookup_min": args.sampled_lookup_min} if sampled else {}
    domains = args.sampled_domains.split(",") if sampled else None
    rows = {"rows": args.sampled_rows if sampled else args.rows, "domains": domains}
    job = write_job(tmp, engine, name, rows, None, temperature=float(sampled), **lookup)
    options = flags(rows=rows["rows"], samples=args.samples, tokens=args.tokens)
    options += ["--set", f"sampling.max_tokens={args.max_tokens}"]
    env = PLANTED if planted else None
    _, line = verify(job, tmp / name, *options, env=env, expected=int(planted))
    return f"{name}: {line}"


def main() -> None:
    # --only: one engine; --rows: prompts (x n=4 rows) of every domain; --sampled-rows: the
    # prompts verify samples, of --sampled-domains (penalties keep n-gram drafts off the first
    # tokens of chat and math prompts: a planted bias there goes unseen);
    # --sampled-lookup-min: the sampled verify jobs' prompt_lookup_min (vLLM's job has 2).
    ap = parser(__doc__, rows=12, sampled_rows=3, samples=200, tokens=4, max_tokens=32)
    options(ap, sampled_domains="translation,summarization,code", sampled_lookup_min=1)
    options(ap, modes="greedy,sampled", skip_verify=False, skip_rows=False)
    ap.add_argument("--only", choices=sorted(ENGINES))
    args = ap.parse_args()
    print(f"sampling: {json.dumps(SAMPLING)}, float32, max_tokens {args.max_tokens}", flush=True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for engine in [args.only] if args.only else list(ENGINES):
            for k_top in () if args.skip_rows else (1, 20):
                print(compare_rows(tmp, engine, k_top, args), flush=True)
            for mode in [] if args.skip_verify else args.modes.split(","):
                for planted in (False, True):
                    print(check_verify(tmp, engine, mode, planted, args), flush=True)


if __name__ == "__main__":
    main()
