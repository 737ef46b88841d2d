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
from typing import Any

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.speculation.shared import ENGINES, check_tuning, read_tuning


def with_engine(spec: JobSpec, engine: str) -> JobSpec:
    """The job on this engine (every other setting equal)."""
    s = spec.speculative.model_copy(update={"engine": engine})
    return spec.model_copy(update={"speculative": s})


def predicted_rate(
    entry: dict[str, Any], rows: dict[str, int], spec: JobSpec
) -> tuple[float, float]:
    """Output tokens/s of the job's rows at one batch size on one engine, from its tuning
    entry, and that figure's standard error: each domain at the K its run would use (the
    controller's choice, or the spec's fixed K when that was measured: ``per_domain``, or
    every K with ``adaptive: false``), its rows' tokens
    over its measured rate, summed; the domains' rate noises propagated to the total time."""
    tokens = seconds = variance = 0.0
    for domain, d in entry["domains"].items():
        measured_k = {int(k): r for k, r in d["tokens_per_s"].items()}  # str keys once saved
        noise = {int(k): e for k, e in d.get("noise_tokens_per_s", {}).items()}
        k = d["chosen_k"]
        s = spec.speculative  # a fixed K (per_domain, or no controller) is what runs
        fixed = s.per_domain.get(domain) if s.adaptive else s.k_for(domain)
        if fixed is not None and fixed in measured_k:
            k = fixed
        rate = measured_k[k]
        obs = [o for o in entry["observations"] if str(o["domain"]) == domain and o["rows"]]
        if not obs:
            continue  # every sampled row failed: nothing to weigh
        per_row = sum(o["output_tokens"] for o in obs) / sum(o["rows"] for o in obs)
        n = rows.get(domain, 0) * per_row
        tokens += n
        seconds += n / rate if rate > 0 else float("inf")
        variance += (n / rate**2 * noise.get(k, 0.0)) ** 2 if rate > 0 else 0.0
    if not 0 < seconds < float("inf"):
        return 0.0, 0.0
    return tokens / seconds, tokens * math.sqrt(variance) / seconds**2


def route_table(
    engines: dict[str, dict[str, Any]], rows: dict[str, int], spec: JobSpec
) -> list[dict[str, Any]]:
    """Per batch size tuned: each engine's predicted tokens/s with its noise, and the faster
    engine (vLLM on a tie: the production engine, with tensor parallelism and every
    speculative method)."""
    table = []
    for i, entry in enumerate(engines["vllm"]["batches"]):
        rates, noise = {}, {}
        for e in ENGINES:
            rates[e], noise[e] = predicted_rate(engines[e]["batches"][i], rows, spec)
        best = "tree" if rates["tree"] > rates["vllm"] else "vllm"
        table.append(
            {"batch": entry["batch"], "engine": best, "tokens_per_s": rates, "noise": noise}
        )
    return table


def format_route(route: dict[str, Any]) -> str:
    """One line per batch size: both engines' predicted tokens/s and the choice."""
    r, e = route["tokens_per_s"], route.get("noise", {})
    other = "vllm" if route["engine"] == "tree" else "tree"
    ratio = r[route["engine"]] / r[other] if r[other] > 0 else float("inf")
    close = abs(r["tree"] - r["vllm"]) <= math.hypot(e.get("tree", 0.0), e.get("vllm", 0.0))
    return (
        f"batch {route['batch']}: tree engine {r['tree']:.1f}±{e.get('tree', 0.0):.1f} tok/s, "
        f"vLLM {r['vllm']:.1f}±{e.get('vllm', 0.0):.1f} tok/s (each domain at its chosen K, "
        f"the job's rows) -> {route['engine']} ({ratio:.2f}x"
        + (", within the noise: tune more rows to be sure)" if close else ")")
    )


def route_job(spec: JobSpec, out: OutDir) -> JobSpec:
    """The job on the engine it runs on: its own, or for ``auto`` the one the output
    directory's tuning file measured faster at ``max_num_seqs`` (UserError without one)."""
    if spec.speculative.engine != "auto":
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
    for route in tuning.get("route", []):
        if route["batch"] == batch:
            return with_engine(spec, route["engine"])
    measured = [r["batch"] for r in tuning.get("route", [])]
    raise UserError(
        f"speculative.engine: auto: {path} routes batch sizes {measured}, the job runs "
        f"model.max_num_seqs={batch}: run batchspec tune --batch {batch}"
    )
