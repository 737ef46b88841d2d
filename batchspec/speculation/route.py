"""``speculative.engine: auto``: a job runs on whichever engine ``batchspec tune`` measured
faster at its batch size.

Neither engine wins everywhere. On the 2-core CPU here batchspec's tree engine is 1.58x
vLLM's best n-gram chain at batch 1 and 1.24x at batch 8, and ties it at 16 (README, *Draft
trees*); on GPUs vLLM's kernels and CUDA graphs change the picture again. So the choice is
measured, like K: ``tune`` sweeps the K grid on both engines and records, per batch size, the
output tokens/s the job's own rows would get on each (every domain at the K its run would
use, weighted by the job's rows per domain) and the faster engine. ``route_job`` reads that
record at the start of every worker; without one it refuses the job rather than guess.
"""

from __future__ import annotations

import math

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.spec.tree import AUTO, ENGINES, TREE, VLLM
from batchspec.speculation.tuning import (
    BatchTuning,
    EngineTuning,
    RouteEntry,
    check_tuning,
    read_tuning,
)


def with_engine(spec: JobSpec, engine: str) -> JobSpec:
    """The job on this engine (every other setting equal)."""
    s = spec.speculative.model_copy(update={"engine": engine})
    return spec.model_copy(update={"speculative": s})


def predicted_rate(entry: BatchTuning, rows: dict[str, int], spec: JobSpec) -> tuple[float, float]:
    """Output tokens/s of the job's rows at one batch size on one engine, from its tuning
    entry, and that figure's standard error: each domain at the K its run would use (the
    controller's choice, or the spec's fixed K when that was measured: ``fixed_k``), its rows'
    tokens over its measured rate, summed; the domains' rate noises propagated to the total
    time."""
    tokens = seconds = variance = 0.0
    for domain, d in entry.domains.items():
        fixed = spec.speculative.fixed_k(domain)  # a fixed K is what runs
        k = fixed if fixed is not None and fixed in d.tokens_per_s else d.chosen_k
        rate = d.tokens_per_s[k]
        obs = [o for o in entry.observations if str(o.domain) == domain and o.rows]
        if not obs:
            continue  # every sampled row failed: nothing to weigh
        per_row = sum(o.output_tokens for o in obs) / sum(o.rows for o in obs)
        n = rows.get(domain, 0) * per_row
        tokens += n
        seconds += n / rate if rate > 0 else float("inf")
        variance += (n / rate**2 * d.noise_tokens_per_s.get(k, 0.0)) ** 2 if rate > 0 else 0.0
    if not 0 < seconds < float("inf"):
        return 0.0, 0.0
    return tokens / seconds, tokens * math.sqrt(variance) / seconds**2


def route_table(
    engines: dict[str, EngineTuning], rows: dict[str, int], spec: JobSpec
) -> list[RouteEntry]:
    """Per batch size tuned: each engine's predicted tokens/s with its noise, and the faster
    engine (vLLM on a tie: the production engine, with tensor parallelism and every
    speculative method)."""
    table = []
    for i, entry in enumerate(engines[VLLM].batches):
        rates, noise = {}, {}
        for e in ENGINES:
            rates[e], noise[e] = predicted_rate(engines[e].batches[i], rows, spec)
        best = TREE if rates[TREE] > rates[VLLM] else VLLM
        table.append(RouteEntry(batch=entry.batch, engine=best, tokens_per_s=rates, noise=noise))
    return table


def format_route(route: RouteEntry) -> str:
    """One line per batch size: both engines' predicted tokens/s and the choice."""
    r, e = route.tokens_per_s, route.noise
    other = VLLM if route.engine == TREE else TREE
    ratio = r[route.engine] / r[other] if r[other] > 0 else float("inf")
    close = abs(r[TREE] - r[VLLM]) <= math.hypot(e.get(TREE, 0.0), e.get(VLLM, 0.0))
    return (
        f"batch {route.batch}: tree engine {r[TREE]:.1f}±{e.get(TREE, 0.0):.1f} tok/s, "
        f"vLLM {r[VLLM]:.1f}±{e.get(VLLM, 0.0):.1f} tok/s (each domain at its chosen K, "
        f"the job's rows) -> {route.engine} ({ratio:.2f}x"
        + (", within the noise: tune more rows to be sure)" if close else ")")
    )


def route_job(spec: JobSpec, out: OutDir) -> JobSpec:
    """The job on the engine it runs on: its own, or for ``auto`` the one the output
    directory's tuning file measured faster at ``max_num_seqs`` (UserError without one)."""
    if spec.speculative.engine != AUTO:
        return spec
    path, batch = out.tuning, spec.model.max_num_seqs
    tuning = read_tuning(path)
    if tuning is None:
        raise UserError(
            f"speculative.engine: auto runs the engine batchspec tune measured faster, and "
            f"{path} does not exist: run batchspec tune on the job first (or set "
            "speculative.engine to vllm or tree)"
        )
    check_tuning(tuning, spec, path)
    routes = tuning.route or []
    for route in routes:
        if route.batch == batch:
            return with_engine(spec, route.engine)
    raise UserError(
        f"speculative.engine: auto: {path} routes batch sizes {[r.batch for r in routes]}, the "
        f"job runs model.max_num_seqs={batch}: run batchspec tune --batch {batch}"
    )
