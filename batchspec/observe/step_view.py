"""How a run priced its engine's steps, as ``report`` prints it: vLLM's fit of its own steps,
or the tree engine's step profile checked against the run's steps and the nodes its replayed
trees held. Apart from ``report.py``'s domain tables: it reads only the run's step file.
"""

from __future__ import annotations

from batchspec.engines.tree.drafted import seconds_drafted
from batchspec.io.layout import OutDir
from batchspec.speculation.steps import read_step_fit


def format_step_fit(out: OutDir) -> str:
    """The step costs K was priced by: vLLM's fit of its steps (``engines.vllm_steps``: the
    terms, and per engine K the measured mean step against the fit's), or the tree engine's
    profile checked against the run's steps (``format_profile_check``); empty where no run
    wrote either."""
    found = read_step_fit(out)
    if found is None:
        return ""
    batch, fit = found
    if fit.get("kind") == "tree-profile":
        return format_profile_check(batch, fit)
    c = {name: value * 1000 for name, value in fit.get("coefficients", {}).items()}
    if not c:
        return f"vLLM step cost: {fit.get('steps', 0)} steps seen, too few to fit"
    prior = f" (+{fit['prior_steps']:.0f} of earlier runs)" if fit.get("prior_steps") else ""
    lines = [
        f"vLLM step cost, fitted from {fit['steps']} steps{prior}: {c['step']:.2f} ms"
        f" + {c['rows']:.3f} ms/row + {c['spec_rows']:.3f} ms/row when speculating"
        f" + {c['drafted']:.3f} ms/drafted token + {c['prefill']:.4f} ms/prefill token;"
        f" drafts filled {fit['fill']:.0%} of their slots"
    ]
    for k, m in sorted(fit.get("by_engine_k", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"  engine K={k}: {m['steps']:.0f} steps, measured {m['measured_s'] * 1000:.1f} ms"
            f" a step, fitted {m['fitted_s'] * 1000:.1f} ms"
        )
    priced = ", ".join(
        f"K={k} {s * 1000:.1f}±{e * 1000:.1f}" for k, (s, e) in fit.get("priced", {}).items()
    )
    lines.append(f"  a decode step of {batch} rows, ms: {priced}")
    return "\n".join(lines)


def format_profile_check(batch: int, check: dict) -> str:
    """The tree engine's step profile against the run's own steps (``engines.tree.step_check``):
    the mean ratio, whether it rescaled the profile, each cell with steps enough to judge
    (measured against profiled, and whether its own figure replaced the profile's), the
    price of every K beside its profiled forward, and the nodes the replayed trees held."""
    band = f"±{check['tolerance'] - 1:.0%}"
    verdict = (
        f"beyond {band} and noise: profile scaled x{check['scale']:.2f}"
        if check["scale"] != 1.0
        else f"within {band} or noise: profile kept"
    )
    lines = [
        f"tree step profile, checked against {check['steps']} steps of this run: measured /"
        f" profiled {check['ratio']:.2f} on average, {verdict}"
    ]
    for c in check["cells"]:
        lines.append(
            f"  {c['batch']} rows, {c['nodes']} nodes: {c['steps']} steps, measured"
            f" {c['measured_s'] * 1000:.1f} ms a step, profiled {c['profiled_s'] * 1000:.1f} ms"
            + (": priced as measured" if c["replaced"] else "")
        )
    priced = ", ".join(
        f"K={k} {s * 1000:.1f} (profiled {p * 1000:.1f})" for k, (s, p) in check["priced"].items()
    )
    lines.append(f"  a step of {batch} rows, ms: {priced}")
    return "\n".join(lines + _drafted_nodes(batch, check))


def _drafted_nodes(batch: int, check: dict) -> list[str]:
    """The nodes the run's replayed trees held a decode step at each K > 0, every domain
    pooled (the tree engine's fill, as vLLM's line gives its drafts' share of their slots),
    and the forward a step of ``batch`` rows is priced at there (``engines.tree.drafted``:
    at the mean where forwards are packed, else the widest tree's bound); each domain is
    priced at its own nodes. None in older runs."""
    drafted = {int(k): float(v) for k, v in (check.get("drafted") or {}).items() if int(k) > 0}
    if not drafted or not check.get("by_nodes"):
        return []
    prices = {int(n): float(s) for n, s in check["by_nodes"]}
    packed, cells = bool(check.get("packed")), []
    for k, mean in sorted(drafted.items()):
        at = prices.__getitem__
        ms = seconds_drafted(at, sorted(prices), k, mean / k, batch, packed) * 1000
        cells.append(f"K={k} {mean:.2f} ({mean / k:.0%}), {ms:.1f} ms")
    widest = f" at the widest of {batch} such trees" if batch > 1 and not packed else ""
    return [
        "  replayed trees held, nodes a decode step (every domain pooled), and the forward a"
        f" step of them is priced at{widest}: " + ", ".join(cells)
    ]
