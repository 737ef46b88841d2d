"""``report``'s view of the drafter choice (``speculative.drafters``): per domain, the drafter
and K the controller would choose now, and every drafter's predicted tokens/s at its best K,
priced as the run priced them (``speculation/drafters.py``), from the output directory alone.
"""

from __future__ import annotations

from collections import Counter

from batchspec.io.layout import OutDir
from batchspec.observe.report import _fmt, _table
from batchspec.speculation.drafters import DrafterChoice, Pick
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.steps import read_drafting, read_fill_cost, read_step_costs

DrafterView = tuple[int, dict[str | None, Pick]]


def drafter_view(out: OutDir) -> DrafterView | None:
    """The batch size and each domain's pick (drafter, K, rate, every drafter's rates); None
    where the run chose no drafter (a job with one drafter, or nothing committed yet).

    The run's units name the drafter they ran; the method (where domains start) is the first
    unit's. Steps are priced from the worker's step file: its seconds at K hold the method's
    drafting, which each other drafter's measured drafting replaces."""
    observations = [o for o in SharedStats(out, "report").read_new() if o.engine in (None, "tree")]
    chose = [o for o in observations if o.replays]
    if not chose:
        return None
    batch = Counter(o.batch for o in chose).most_common(1)[0][0]
    drafters = [*dict.fromkeys(d for o in chose for d in (o.drafter, *o.replays) if d)]
    method = chose[0].drafter or drafters[0]
    grid = sorted({k for o in chose for items in o.replays.values() for k, *_ in items} | {0})
    choice = DrafterChoice(drafters, method, batch, grid, default_k=max(grid))
    seconds = read_step_costs(out, "tree", batch)
    drafting = read_drafting(out, "tree", batch)
    if seconds is not None:
        own = batch * drafting.get(method, 0.0)
        fill = read_fill_cost(out, "tree", batch)  # a domain's own drafted nodes
        filled = (lambda k, f: fill(k, f) - (own if k > 0 else 0.0)) if fill else None
        choice.price(lambda k: seconds(k) - (own if k > 0 else 0.0), drafting.get, filled)
    for ob in observations:
        choice.add(ob)
    domains = sorted({o.domain for o in chose}, key=lambda d: (d is None, d or ""))
    return batch, {d: choice.choose(d) for d in domains}


def format_drafter_view(view: DrafterView, markdown: bool = False) -> str:
    """Per domain the chosen drafter, its K and the batch's predicted tokens/s there, then
    plain decoding's and each drafter's best K with its predicted tokens/s (``-``: no drafter
    priced: not replayed, or a model drafter that has not run in the domain)."""
    batch, picks = view
    drafters = [*dict.fromkeys(d for p in picks.values() for d in p.options)]
    header = ["domain", "drafter", "K", "tok/s", "K=0", *drafters]
    lines = []
    for domain, pick in picks.items():
        tok_s = pick.rate * batch if pick.rate is not None else None
        plain = next((r.get(0) for r in pick.options.values() if 0 in r), None)
        cells = [domain or "-", pick.drafter, str(pick.k), _fmt(tok_s, 1)]
        cells.append(_fmt(plain * batch if plain is not None else None, 1))
        for d in drafters:
            spec = {k: r for k, r in pick.options.get(d, {}).items() if k > 0}
            best = max(spec, key=lambda k: (spec[k], -k)) if spec else None
            cells.append("-" if best is None else f"K={best} {spec[best] * batch:.1f}")
        lines.append(cells)
    title = (
        f"drafter per domain at batch {batch}: the chosen drafter and K, the batch's predicted "
        "tokens/s there, plain decoding's, and each drafter's at its best K"
    )
    return _table(title, header, lines, markdown)
