"""Every speculative method batchspec accepts, end to end on vLLM (issue 34, V4): for each, a
run of the default job's first rows (output tokens/s, acceptance, whether the K controller's
acceptance is replayed or modelled, as ``report`` says), ``verify`` greedy and sampled, and
each again with the planted bias (every draft accepted, ``engines.planted``), which must fail.
Prints one Markdown row per method (the table in docs/vllm-methods.md).

    .venv/bin/python scripts/checks/vllm_methods.py --work /tmp/vm               # every method
    .venv/bin/python scripts/checks/vllm_methods.py --work /tmp/vm --only suffix,draft_model
    .venv/bin/python scripts/checks/vllm_methods.py --work /tmp/vr --runs-only --adaptive
    .venv/bin/python scripts/checks/vllm_methods.py --work /tmp/vv --only ngram,draft_model \\
        --verify-only --dtype bfloat16 --rows 24 --max-tokens 64 --sampled-rows 3 --samples 400 \\
        --tokens 4

The last is verify's full set (docs/verify.md): greedy rows compared in float32 and bfloat16
(near-ties classified), more prompts sampled. A bfloat16 verify runs vLLM in processes of its
own (vLLM 0.32 in one process fails an engine start after one of another dtype); the planted
bias stays in float32.

EAGLE-3 needs a head: ``--head DIR`` (a ``batchspec distill`` output), else the script makes
one first (a run of 24 rows, then ``batchspec distill --holdout 0 --epochs 3``). Suffix
decoding needs ``bash scripts/setup_suffix.sh``. ``eagle`` and ``mtp`` are run through
``validate`` only: no head or model for them exists here (the docs say why). The runs run
vLLM as production does; every float32 verify runs it in the CLI's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which the planted bias needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import PLANTED, check_line, cli, job_file, options, parser, parts, run_cli, verify

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
DRAFT = "builtin:smollm2-135m-draft"
METHODS = ["none", "ngram", "draft_model", "eagle3", "suffix", "eagle", "mtp"]
"""``none``: the K=0 baseline of the runs' tokens/s (nothing to verify)."""
SAMPLED_TOKENS = {"eagle3": "4"}
"""Tokens compared by the sampled verify (default ``--tokens``): a small head's first draft after
"Maria" was accepted in none of 150 samples, so it is given three speculative positions."""


def write_job(path: Path, speculative: dict, per_domain: int | None = 1, **changes) -> Path:
    """The default job over the first ``per_domain`` prompts of each domain (``domains``: of
    those alone; ``rows``: that many, the domains in turn), K=3 fixed, with ``changes`` per
    section. The default job's n-gram bounds stay (vLLM's own, 5..5, match far less)."""
    rows = {k: changes.pop(k, None) for k in ("domains", "rows")} | {"per_domain": per_domain}
    sections = {
        "output": {"dir": str(path.parent / f"{path.stem}-out"), "unit_rows": 64},
        "model": {"max_model_len": 1024, "max_num_seqs": 8} | changes.pop("model", {}),
        "speculative": {"num_speculative_tokens": 3, "adaptive": False} | speculative,
    }
    return job_file(path, rows=rows, **sections, **changes)


def make_head(work: Path) -> str:
    """An EAGLE-3 head distilled from a run of 24 rows (the first four of each domain)."""
    job = write_job(work / "head.yaml", {"method": "ngram"}, 4, sampling={"max_tokens": 32})
    for args in (["run", str(job)], ["distill", str(job), "--holdout", "0", "--epochs", "3"]):
        proc, took = cli(*args, env=IN_PROCESS)
        print(f"head: batchspec {args[0]} exit {proc.returncode} in {took:.0f} s", flush=True)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
    return str(work / "head-out" / "drafts" / "eagle3")


def run_figures(job: Path) -> str:
    """``batchspec run`` then ``report``: tokens/s, acceptance, and replay (exact: the runs'
    own check of replay against the engine's counts) or the geometric model (report's line)."""
    # As production runs it: engine core and model in processes of their own (in the CLI's
    # process, speculative runs were ~6x slower here: n-gram 9.1 against 53.8 tok/s).
    out = job.parent / f"{job.stem}-out"
    got = run_cli(job, out, check=False)
    if "exit" in got:
        return f"run exit {got['exit']}: {got['error']}"
    done = parts(out)
    drafted = done["num_draft_tokens"].sum() or 0
    accepted = done["num_accepted_tokens"].sum() or 0
    text = f"{len(done)} rows, {got['tok_s']:.1f} tok/s"
    if drafted:
        text += f", {accepted}/{drafted} drafts accepted ({accepted / drafted:.2f})"
    checked, equal = got["replay_checked"], got["replay_equal"]
    report, _ = cli("report", str(out))
    said = [x for x in report.stdout.splitlines() if x.startswith("K per domain")]
    if not drafted:
        return f"{text} | -"
    if checked:
        exact = f"exact: replay equal to vLLM's count on {equal}/{checked} rows"
        return f"{text} | {exact}" + (f"; report: {said[0]}" if said else "")
    return f"{text} | modelled: report: {said[0] if said else '(no K view)'}"


def verify_figures(job: Path, planted: bool, *args: str, env: dict | None = IN_PROCESS) -> str:
    """One ``verify`` (in the CLI's process, which the planted bias needs; ``env`` None: in
    processes of its own) and its figures."""
    out = job.parent / f"{job.stem}-{'planted' if planted else 'ok'}"
    rep, line = verify(job, out, *args, env=PLANTED if planted else env)
    if rep is None:
        return line
    verdict = {0: "pass", 1: "FAIL"}.get(rep["exit"], f"exit {rep['exit']}")
    checks = "; ".join(check_line(c) for c in rep["checks"])  # greedy in bf16: float32 too
    accepted = rep.get("drafts_accepted", "?")
    verdict = "INCONCLUSIVE" if rep.get("inconclusive") else verdict
    return f"{verdict}: {checks}, {accepted} drafts accepted, {rep['seconds']:.0f} s"


def validate_only(work: Path, method: str, speculative: dict) -> str:
    job = write_job(work / f"{method}.yaml", speculative)
    proc, _ = cli("validate", str(job))
    return (
        f"validate exit {proc.returncode}: {(proc.stderr.strip() or proc.stdout).splitlines()[-1]}"
    )


def method_row(work: Path, method: str, speculative: dict, args: argparse.Namespace) -> str:
    """The table's row of one method: run | replay | greedy | planted | sampled | planted."""
    if method in ("eagle", "mtp"):
        return f"| {method} | {validate_only(work, method, speculative)} |"
    adaptive = {"adaptive": True} if args.adaptive and method != "none" else {}
    cells = []
    if not args.verify_only:
        run_job = write_job(
            work / f"{method}-run.yaml", speculative | adaptive, 2, sampling={"max_tokens": 64}
        )
        cells.append(run_figures(run_job))
    if method != "none" and not args.runs_only:
        cells += verify_cells(work, method, speculative, args)
    return f"| {method} | " + " | ".join(cells) + " |"


def verify_cells(work: Path, method: str, speculative: dict, args: argparse.Namespace):
    """Greedy (``--rows`` over the domains), planted, sampled (``--sampled-rows`` math
    prompts), planted; the planted ones in float32."""
    greedy, sampled = {"max_tokens": args.max_tokens}, {"max_tokens": 32, "temperature": 1.0}
    jobs = {}
    for dtype in {args.dtype, "float32"}:
        jobs["greedy", dtype] = write_job(
            work / f"{method}-greedy-{dtype}.yaml", speculative, None, rows=args.rows,
            model={"dtype": dtype}, sampling=greedy,
        )  # fmt: skip
        jobs["sampled", dtype] = write_job(
            work / f"{method}-sampled-{dtype}.yaml", speculative, args.sampled_rows,
            domains=["math"], model={"max_num_seqs": 32, "dtype": dtype}, sampling=sampled,
        )  # fmt: skip
    tokens = SAMPLED_TOKENS.get(method, str(args.tokens))
    env = IN_PROCESS if args.dtype == "float32" else None
    g_args = ("--rows", str(args.rows))
    s_args = ("--rows", str(args.sampled_rows), "--samples", str(args.samples), "--tokens", tokens)
    return [
        verify_figures(jobs["greedy", args.dtype], False, *g_args, env=env),
        verify_figures(jobs["greedy", "float32"], True, *g_args),
        verify_figures(jobs["sampled", args.dtype], False, *s_args, env=env),
        verify_figures(jobs["sampled", "float32"], True, *s_args),
    ]


def main() -> None:
    # --only: comma-separated methods (default: all); --head: an EAGLE-3 head (a batchspec
    # distill output), else one is made; --runs-only: the runs alone, no verify; --adaptive:
    # the runs with the K controller; --verify-only: no runs; --dtype: the verifies' (not the
    # planted ones'); --rows, --max-tokens: greedy rows; --sampled-rows, --samples, --tokens:
    # sampled prompts, samples of each, positions compared.
    ap = parser(__doc__, only=None, head=None, runs_only=False, adaptive=False, verify_only=False)
    options(ap, dtype="float32", rows=6, max_tokens=32, sampled_rows=1, samples=150, tokens=2)
    ap.add_argument("--work", type=Path, required=True, help="a new directory for the runs")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    methods = args.only.split(",") if args.only else METHODS
    specs = {m: {"method": m} for m in methods}
    if "draft_model" in specs:
        specs["draft_model"]["model"] = DRAFT
    for m in ("eagle3", "eagle"):
        if m in specs:
            args.head = args.head or make_head(args.work)
            specs[m]["model"] = args.head
    runs = [] if args.verify_only else ["run: rows, tok/s, acceptance", "replay"]
    checks = [] if args.runs_only else ["greedy", "greedy planted", "sampled", "sampled planted"]
    print("| method | " + " | ".join(runs + checks) + " |")
    for method, spec in specs.items():
        print(method_row(args.work, method, spec, args), flush=True)


if __name__ == "__main__":
    main()
