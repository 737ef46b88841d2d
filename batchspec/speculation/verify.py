"""``batchspec verify``: run a sample of a job's rows with its speculative setting and without,
every other engine setting equal, and check that the target's output distribution is unchanged.

- Greedy jobs (temperature 0): token-level comparison, once in float32, where the two runs
  must agree token for token, and once more in the job's dtype when it is another one, where
  low-precision kernels flip near-ties: each divergence is explained by the target's own
  log-probabilities at its first divergent position (``verify_checks.compare_greedy``).
- Sampled jobs: many samples per prompt, each with a seed of its own (the plain and the
  speculative samples use disjoint seeds, so the two samples are independent), and a
  two-sample test per prompt and position of the first ``tokens`` generated tokens
  (``verify_checks.sampled_check``).

It drives engines only through ``open_engine`` and ``Engine.run``, so any engine batchspec has
is verified the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from batchspec.engines import open_engine
from batchspec.errors import UserError
from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.speculation.tune import ListSource, sample_units
from batchspec.speculation.verify_checks import greedy_check, sampled_check
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

LOGPROBS = 5
"""Top log-probabilities asked per position: the margin needs the target's logprob of the
token speculation produced, which is its runner-up at a true near-tie."""


def pick_rows(spec: JobSpec, rows: int) -> tuple[list[WorkUnit], dict[Any, int], Any]:
    """The job's units that hold the sample, rows per domain (as even as the domains allow,
    the first rows of each), and the preflight's tokenizer."""
    pre = preflight(spec)
    sizes = pre.domains()
    domains = sorted(sizes, key=str)
    quota: dict[Any, int] = {}
    left = rows
    # Even shares; a small domain's unused share goes to the others, in turn.
    while left > 0 and any(quota.get(d, 0) < sizes[d] for d in domains):
        for d in domains:
            if left > 0 and quota.get(d, 0) < sizes[d]:
                quota[d] = quota.get(d, 0) + 1
                left -= 1
    picked = sample_units(pre.units, max(quota.values(), default=0))
    units = [u for d in domains for u in picked.get(d, [])]
    if not units:
        raise UserError(f"input.path: no rows in {spec.input.path!r} to verify")
    return units, quota, load_tokenizer(pre.tokenizer_dir, "model.tokenizer")


def build_requests(
    spec: JobSpec, units: list[WorkUnit], quota: dict[Any, int], tokenizer: Any, max_len: int
) -> list[RowRequest]:
    builder = PromptBuilder(spec.input, tokenizer, max_len, spec.sampling.seed)
    taken: dict[Any, int] = {}
    out = []
    for unit in units:
        for req in builder.build(unit).rows:
            if taken.get(unit.domain, 0) < quota.get(unit.domain, 0):
                taken[unit.domain] = taken.get(unit.domain, 0) + 1
                out.append(req)
    return out


def run_rows(engine: Any, unit: WorkUnit, rows: list[RowRequest]) -> list[RowResult]:
    """Every row through the engine, results in the rows' order."""
    results: list[RowResult] = []
    for res in engine.run(ListSource([UnitRequests(unit, list(rows))]), lambda: False):
        results.extend(res.results)
    return results


class _Runner:
    """Opens the plain and the speculative engine of one spec, one at a time."""

    def __init__(self, spec: JobSpec, rows: int, echo: Callable[[str], object]):
        self.spec = spec
        self.k = spec.speculative.num_speculative_tokens
        self.units, self.quota, self.tokenizer = pick_rows(spec, rows)
        self.echo = echo
        self.engines: list[dict[str, Any]] = []

    def both(self, spec: JobSpec, copies: int = 1) -> tuple[list[RowResult], list[RowResult]]:
        """The sampled rows (each ``copies`` times in a row) through an engine without
        speculation and one with the job's K. Rows carry no seed: with copies, the two
        engines' own seeds differ, so their samples are independent (and vLLM 0.32 on CPU
        fails seeded requests whose prefill is split: "CPU Generator does not use offset")."""
        out = []
        for k in (0, self.k):
            run_spec = (
                spec if k == 0 or copies == 1 else _with(spec, "model", seed=spec.model.seed + 1)
            )
            engine = open_engine(run_spec, k, LOGPROBS if copies == 1 else None)
            try:
                base = build_requests(
                    spec, self.units, self.quota, self.tokenizer, engine.max_model_len
                )
                rows = [replace(r, seed=None) for r in base for _ in range(copies)]
                started = time.perf_counter()
                if copies > 1:
                    # Each prompt once first: its copies then find its prefill in vLLM's
                    # prefix cache (copies scheduled in one step cannot share it).
                    run_rows(engine, self.units[0], base)
                out.append(run_rows(engine, self.units[0], rows))
                took = time.perf_counter() - started
                self.engines.append(
                    {"dtype": spec.model.dtype, "k": k, "method": engine.method, "rows": len(rows),
                     "build_s": engine.build_s, "run_s": took}
                )  # fmt: skip
                self.echo(
                    f"  {spec.model.dtype} {engine.method} K={k}: {len(rows)} rows in {took:.1f} s"
                )
            finally:
                engine.close()
        return out[0], out[1]


def _with(spec: JobSpec, section: str, **values: Any) -> JobSpec:
    part = getattr(spec, section).model_copy(update=values)
    return spec.model_copy(update={section: part})


def verify_greedy(runner: _Runner, near_tie: float | None) -> list[dict[str, Any]]:
    """float32 (identity required), then the job's dtype when it is another one."""
    own = runner.spec.model.dtype
    checks = []
    for dtype in ["float32"] + ([own] if own != "float32" else []):
        spec = _with(runner.spec, "model", dtype=dtype)
        plain, specul = runner.both(spec)
        checks.append(greedy_check(dtype, plain, specul, near_tie).summary())
    return checks


def verify_sampled(runner: _Runner, samples: int, tokens: int, alpha: float) -> dict[str, Any]:
    spec = _with(runner.spec, "sampling", max_tokens=tokens)
    plain, specul = runner.both(spec, samples)
    prompts = []
    for p in range(len(plain) // samples):
        chunk = slice(p * samples, (p + 1) * samples)
        prompts.append((plain[chunk.start].request.row_id, plain[chunk], specul[chunk]))
    return sampled_check(prompts, tokens, alpha)


def verify(
    spec: JobSpec,
    rows: int,
    samples: int,
    tokens: int,
    alpha: float,
    near_tie: float | None,
    echo: Callable[[str], object] = print,
) -> dict[str, Any]:
    """Run the checks the job's sampling calls for; the report (``passed`` says the verdict)."""
    s = spec.speculative
    if s.method == "none" or s.num_speculative_tokens == 0:
        raise UserError("speculative.method is none: there is no speculation to verify")
    runner = _Runner(spec, rows, echo)
    greedy = spec.sampling.temperature == 0
    if greedy:
        checks = verify_greedy(runner, near_tie)
    else:
        checks = [verify_sampled(runner, samples, tokens, alpha)]
    return {
        "created": time.time(),
        "method": s.method,
        "k": runner.k,
        "dtype": spec.model.dtype,
        "temperature": spec.sampling.temperature,
        "rows_per_domain": {str(d): n for d, n in runner.quota.items()},
        "samples_per_prompt": None if greedy else samples,
        "engines": runner.engines,
        "checks": checks,
        "passed": all(c["passed"] for c in checks),
    }


def write_report(out_dir: Path, report: dict[str, Any]) -> Path:
    """``OUT/verify/report-<UTC time>.json``: every verify run keeps its own report."""
    folder = out_dir / "verify"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(report["created"]))
    path = folder / f"report-{stamp}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)
    return path
