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

from batchspec.engines import ListSource, open_engine
from batchspec.engines.vllm_args import on_cpu
from batchspec.errors import UserError
from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.io.layout import OutDir
from batchspec.measure.tune import sample_units
from batchspec.measure.verify_checks import greedy_check, sampled_check
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.spec.tree import VLLM
from batchspec.speculation.route import route_job
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

CPU_COPY_BLOCK = 32
"""vLLM KV block size for sampled runs on CPU. Prefix caching keeps full blocks only, and the
CPU build's default block of 128 tokens holds no whole prompt of ~70 tokens, so every copy was
prefilled again: 150 copies of one 68-token prompt took 13.7 s at 128 and 1.4 s at 32 (the CPU
attention's smallest). The block size does not change outputs."""
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
    spec: JobSpec,
    units: list[WorkUnit],
    quota: dict[Any, int],
    tokenizer: Any,
    max_len: int,
    cap: int | None = None,
) -> list[RowRequest]:
    """The sampled rows' requests. A row's own settings (sampling.columns) apply; its n
    samples are verify's copies. ``cap`` (the sampled check's tokens) bounds every row's
    ``max_tokens``, and its ``min_tokens`` with it: the tested first tokens see the same
    distribution (end-of-sequence masked below either bound), and vLLM refuses a
    ``min_tokens`` above ``max_tokens``."""
    one = _capped(spec.sampling.model_copy(update={"n": 1}), cap)
    builder = PromptBuilder(spec.input, tokenizer, max_len, spec.sampling.seed, sampling=one)
    taken: dict[Any, int] = {}
    out = []
    for unit in units:
        for req in builder.build(unit).rows:
            if taken.get(unit.domain, 0) < quota.get(unit.domain, 0):
                taken[unit.domain] = taken.get(unit.domain, 0) + 1
                own = req.sampling
                out.append(req if own is None else replace(req, sampling=_capped(own, cap)))
    return out


def _capped(sampling: Any, cap: int | None) -> Any:
    if cap is None:
        return sampling
    bounded = {"max_tokens": min(sampling.max_tokens, cap)}
    return sampling.model_copy(update=bounded | {"min_tokens": min(sampling.min_tokens, cap)})


def run_rows(
    engine: Any, unit: WorkUnit, rows: list[RowRequest], drafters: list[str] | None = None
) -> list[RowResult]:
    """Every row through the engine, results in the rows' order. With ``drafters`` (a job's
    ``speculative.drafters``), the rows dealt out in turn to one unit per drafter, all in one
    batch: every drafter the controller may choose is checked, side by side."""
    groups: list[str | None] = list(drafters or [None])
    units = [UnitRequests(unit, rows[i :: len(groups)], drafter=d) for i, d in enumerate(groups)]
    done = list(engine.run(ListSource(units), lambda: False))
    if len(units) == 1:
        return [r for res in done for r in res.results]
    found = {id(res.unit_requests): res.results for res in done}
    results: list[RowResult] = [None] * len(rows)  # type: ignore[list-item]
    for i, u in enumerate(units):
        results[i :: len(groups)] = found[id(u)]
    return results


class _Runner:
    """Opens the plain engine and one speculative engine per K in use, one at a time."""

    def __init__(
        self, spec: JobSpec, rows: int, k: int | None, echo: Callable[[str], object]
    ) -> None:
        self.spec = spec
        self.units, quota, self.tokenizer = pick_rows(spec, rows)
        # Each domain at the K the job gives it (``speculative.per_domain``), or ``k`` for all;
        # domains that run without speculation have nothing to verify.
        self.ks = {d: spec.speculative.k_for(d) if k is None else k for d in quota}
        self.quota = {d: n for d, n in quota.items() if self.ks[d] > 0}
        if not self.quota:
            raise UserError(
                "speculative.per_domain: every sampled domain has K=0: nothing to verify"
            )
        self.echo = echo
        self.engines: list[dict[str, Any]] = []
        self.accepted: dict[str, int] = {str(d): 0 for d in self.quota}
        """Draft tokens accepted per domain over every speculative run: a domain at 0 was
        not tested (its rows' outputs are the target's by construction)."""

    def both(self, spec: JobSpec, copies: int = 1) -> tuple[list[RowResult], list[RowResult]]:
        """The sampled rows (each ``copies`` times in a row) through an engine without
        speculation and through one engine per K in use, results in the same order. Rows carry
        no seed: with copies, the two runs' engine seeds differ, so their samples are
        independent (and vLLM 0.32 on CPU fails seeded requests whose prefill is split: "CPU
        Generator does not use offset")."""
        plain = self._run(spec, 0, copies, list(self.quota))
        by_k: dict[int, list[Any]] = {}
        for d in self.quota:
            by_k.setdefault(self.ks[d], []).append(d)
        seeded = spec if copies == 1 else _with(spec, "model", seed=spec.model.seed + 1)
        specul: dict[tuple[Any, int], RowResult] = {}
        for k, domains in sorted(by_k.items()):
            for i, res in enumerate(self._run(seeded, k, copies, domains)):
                specul[(res.request.row_id, i % copies)] = res
        return plain, [specul[(r.request.row_id, i % copies)] for i, r in enumerate(plain)]

    def _run(self, spec: JobSpec, k: int, copies: int, domains: list[Any]) -> list[RowResult]:
        engine = open_engine(spec, k, LOGPROBS if copies == 1 else None)
        try:
            quota = {d: self.quota[d] for d in domains}
            units = [u for u in self.units if u.domain in quota]
            cap = spec.sampling.max_tokens if copies > 1 else None
            base = build_requests(spec, units, quota, self.tokenizer, engine.max_model_len, cap)
            rows = [replace(r, seed=None) for r in base for _ in range(copies)]
            started = time.perf_counter()
            if copies > 1:
                # Each prompt once first: its copies then find its prefill in vLLM's prefix
                # cache (copies scheduled in one step cannot share it).
                run_rows(engine, units[0], base)
            out = run_rows(engine, units[0], rows, spec.speculative.drafters if k else None)
            took = time.perf_counter() - started
            # Drafts the check covered: a check of a run that accepted none proves little.
            drafted = sum(r.spec.drafted for r in out if r.spec)
            accepted = sum(r.spec.accepted for r in out if r.spec)
            for r in out if k else []:
                self.accepted[str(r.request.domain)] += r.spec.accepted if r.spec else 0
            self.engines.append(
                {"dtype": spec.model.dtype, "k": k, "method": engine.method, "rows": len(rows),
                 "domains": [str(d) for d in domains], "build_s": engine.build_s, "run_s": took,
                 "drafted": drafted, "accepted": accepted,
                 "by_drafter": by_drafter(out, spec.speculative.drafters) if k else None}
            )  # fmt: skip
            drafts = f", {accepted} of {drafted} drafts accepted" if k else ""
            self.echo(
                f"  {spec.model.dtype} {engine.method} K={k}: {len(rows)} rows in {took:.1f} s"
                + drafts
            )
            return out
        finally:
            engine.close()


def by_drafter(out: list[RowResult], drafters: list[str] | None) -> dict[str, int] | None:
    """Draft tokens accepted per drafter of ``run_rows``'s rows (dealt out in turn); None
    without ``speculative.drafters``."""
    if not drafters:
        return None
    got = dict.fromkeys(drafters, 0)
    for i, r in enumerate(out):
        got[drafters[i % len(drafters)]] += r.spec.accepted if r.spec else 0
    return got


def _with(spec: JobSpec, section: str, **values: Any) -> JobSpec:
    part = getattr(spec, section).model_copy(update=values)
    return spec.model_copy(update={section: part})


def verify_greedy(
    runner: _Runner, near_tie: float | None, float32: bool = True
) -> list[dict[str, Any]]:
    """float32 (identity required; ``float32=False`` skips it, for models too big to run in
    float32), then the job's dtype when it is another one."""
    own = runner.spec.model.dtype
    checks = []
    dtypes = (["float32"] if float32 else []) + ([own] if own != "float32" else [])
    for dtype in dtypes or [own]:
        spec = _with(runner.spec, "model", dtype=dtype)
        plain, specul = runner.both(spec)
        checks.append(greedy_check(dtype, plain, specul, near_tie).summary())
    return checks


def verify_sampled(runner: _Runner, samples: int, tokens: int, alpha: float) -> dict[str, Any]:
    min_tokens = min(runner.spec.sampling.min_tokens, tokens)  # see build_requests
    spec = _with(runner.spec, "sampling", max_tokens=tokens, min_tokens=min_tokens)
    vllm = spec.speculative.engine == VLLM
    if vllm and on_cpu() and "block_size" not in spec.model.engine_kwargs:
        spec = _with(
            spec, "model", engine_kwargs={**spec.model.engine_kwargs, "block_size": CPU_COPY_BLOCK}
        )
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
    k: int | None = None,
    float32: bool = True,
) -> dict[str, Any]:
    """Run the checks the job's sampling calls for; the report (``passed`` says the verdict).
    ``k``: one K for every domain instead of the job's own (``per_domain`` or
    ``num_speculative_tokens``)."""
    if spec.speculative.method == "none":
        raise UserError("speculative.method is none: there is no speculation to verify")
    spec = route_job(spec, OutDir(spec.output_dir))  # engine auto: the one the job runs on
    s = spec.speculative
    runner = _Runner(spec, rows, k, echo)
    greedy = spec.sampling.temperature == 0
    if greedy:
        checks = verify_greedy(runner, near_tie, float32)
    else:
        checks = [verify_sampled(runner, samples, tokens, alpha)]
    # A check of runs that accepted no draft token tested nothing speculation could change:
    # not a pass (drafts that were never right, or prompts whose drafts never match).
    accepted = sum(runner.accepted.values())
    held = all(c["passed"] for c in checks)
    return {
        "created": time.time(),
        "engine": s.engine,
        "method": s.method,
        "k": {str(d): runner.ks[d] for d in runner.quota},
        "dtype": spec.model.dtype,
        "temperature": spec.sampling.temperature,
        "rows_per_domain": {str(d): n for d, n in runner.quota.items()},
        "samples_per_prompt": None if greedy else samples,
        "engines": runner.engines,
        "checks": checks,
        "drafts_accepted": accepted,
        "domains_without_drafts": sorted(d for d, n in runner.accepted.items() if n == 0),
        "inconclusive": held and accepted == 0,
        "passed": held and accepted > 0,
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
