"""Helpers of ``tree.py``: the prompt sample, job variants, one timed engine run, and
the figures drawn from its rows (tokens/s, accepted tokens per verify step, greedy identity).

Everything runs through ``open_engine`` and ``Engine.run``, the calls the worker makes, so the
tree engine and vLLM are timed the same way: from the first unit handed over to the last
result back, engine start and shutdown excluded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from batchspec.engines import open_engine
from batchspec.measure.verify import build_requests, pick_rows, run_rows
from batchspec.measure.verify_checks import DRIFT_FACTOR, compare_greedy, drift
from batchspec.spec import JobSpec
from batchspec.spec.tree import TreeSpec
from batchspec.units import RowRequest, RowResult, SpecStats


@dataclass
class Sample:
    """The prompts every configuration runs: the first rows of each domain, in domain order."""

    unit: Any
    rows: list[RowRequest]
    domains: list[str]


def sample(spec: JobSpec, per_domain: int) -> Sample:
    """``per_domain`` rows of every domain of the job's input (verify's row picking)."""
    from batchspec.io.checks import preflight

    domains = sorted(str(d) for d in preflight(spec).domains())
    units, quota, tokenizer = pick_rows(spec, per_domain * len(domains))
    rows = build_requests(spec, units, quota, tokenizer, spec.model.max_model_len or 2048)
    return Sample(units[0], rows, domains)


def variant(spec: JobSpec, batch: int, tree: dict[str, Any] | None) -> JobSpec:
    """The job at batch size ``batch``, with this tree shape (None: vLLM's chains)."""
    shape = TreeSpec(**tree) if tree is not None else None
    engine = "tree" if tree is not None else "vllm"
    speculative = spec.speculative.model_copy(
        update={"tree": shape, "engine": engine, "adaptive": False}
    )
    model = spec.model.model_copy(update={"max_num_seqs": batch})
    return spec.model_copy(update={"speculative": speculative, "model": model})


@dataclass
class Run:
    """One engine's pass over the sample: rows in sample order and the seconds it took."""

    label: str
    results: list[RowResult]
    seconds: float
    build_s: float
    weight_bytes: int | None

    @property
    def tokens(self) -> int:
        return sum(r.num_output_tokens or 0 for r in self.results)

    @property
    def rate(self) -> float:
        """Output tokens/s, prefill included, engine start excluded."""
        return self.tokens / self.seconds

    def errors(self) -> list[str]:
        return [f"{r.request.row_id}: {r.error}" for r in self.results if r.error is not None]


def run(label: str, spec: JobSpec, k: int, smp: Sample, logprobs: int | None = None) -> Run:
    """Start the engine for ``spec`` and K, run the sample once, close the engine."""
    engine = open_engine(spec, k, logprobs)
    try:
        model = getattr(engine, "model", None)
        weight_bytes = getattr(model, "weight_bytes", None)
        started = time.perf_counter()
        results = run_rows(engine, smp.unit, smp.rows)
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    by_id = {r.request.row_id: r for r in results}
    ordered = [by_id[r.row_id] for r in smp.rows]
    return Run(label, ordered, seconds, engine.build_s, weight_bytes)


def decode_steps_per_s(results: list[RowResult]) -> float:
    """Plain decode steps/s of rows run one at a time: tokens after the first over the time
    from the first token to the last (prefill left out)."""
    steps = sum((r.num_output_tokens or 1) - 1 for r in results)
    span = sum(r.timing["last_token"] - r.timing["first_token"] for r in results if r.timing)
    return steps / span if span > 0 else float("nan")


def per_step(results: list[RowResult], domain: str | None = None) -> float:
    """Mean tokens a verify step yields: 1 + accepted drafts / steps that verified drafts
    (the bonus token plus the accepted path), over the rows of ``domain`` (None: all)."""
    specs = [r.spec for r in results if domain is None or str(r.request.domain) == domain]
    steps = sum(s.steps for s in specs if s)
    accepted = sum(s.accepted for s in specs if s)
    return 1 + accepted / steps if steps else float("nan")


def versus(doms: list[str], k: int, chain: list[RowResult], tree: list[RowResult]) -> list[str]:
    """The table rows of trees against chains of K nodes: tokens per verify step per domain
    and over all rows for each, then tree / chain (issue 13's T3: >= 1.25 at K=8)."""
    lines = []
    for name, rows in (("chain", chain), ("tree", tree)):
        cells = [f"{per_step(rows, d):.3f}" for d in [*doms, None]]
        lines.append(f"| {k} | {name} | " + " | ".join(cells) + " |")
    cells = [f"{per_step(tree, d) / per_step(chain, d):.3f}" for d in doms]
    total = per_step(tree) / per_step(chain)
    return [*lines, f"| {k} | tree / chain | " + " | ".join(cells) + f" | **{total:.3f}** |"]


def versus_header(doms: list[str]) -> str:
    return "| K | shape | " + " | ".join(doms) + " | all |\n" + "|---" * (len(doms) + 3) + "|"


def replay(
    prompt: list[int],
    out: list[int],
    max_tokens: int,
    k: int,
    shape: dict[str, Any],
    lookup: tuple[int, int],
) -> SpecStats:
    """The speculative counts the tree engine makes on a greedy row whose output is ``out``,
    without the model: the n-gram drafter driven over the row as the engine drives it
    (``engines.tree.drafting.replay``; exact for greedy rows, whose target choices are ``out``
    itself, T1's identity). The histogram reaches the deepest accepted path only."""
    from batchspec.engines.tree.drafting import replay as drive
    from batchspec.engines.tree.ngram import NgramDrafter

    got = drive(NgramDrafter(*lookup), prompt, out, k, TreeSpec(**shape), max_tokens)
    deepest = max(got.accepted, default=0)
    return SpecStats(
        steps=len(got.accepted),
        drafted=sum(got.nodes),
        accepted=sum(got.accepted),
        histogram=tuple(got.accepted.count(j) for j in range(deepest + 1)),
        per_step_drafted=tuple(got.depth),
        per_step_accepted=tuple(got.accepted),
    )


def replay_rows(
    ref: list[RowResult], max_tokens: int, k: int, shape: dict[str, Any], lookup: tuple[int, int]
) -> list[RowResult]:
    """The reference rows with the speculative counts ``replay`` gives them at K and shape."""
    out = []
    for r in ref:
        prompt = r.request.prompt_token_ids or []
        spec = replay(prompt, r.token_ids or [], max_tokens, k, shape, lookup)
        out.append(replace(r, spec=spec))
    return out


def counts(r: RowResult) -> tuple[int, int] | None:
    """A row's (verify steps with drafts, accepted drafts)."""
    return (r.spec.steps, r.spec.accepted) if r.spec else None


def identical(ref: list[RowResult], other: list[RowResult]) -> tuple[int, list[Any]]:
    """Rows with the same token ids in both runs, and the ids of those that differ."""
    same, differ = 0, []
    for a, b in zip(ref, other, strict=True):
        if a.token_ids == b.token_ids and a.error is None and b.error is None:
            same += 1
        else:
            differ.append(a.request.row_id)
    return same, differ


def explain(vllm_plain: list[RowResult], tree_plain: list[RowResult]) -> list[str]:
    """vLLM's plain greedy rows against the tree engine's, both with top logprobs: the count of
    identical rows, then every divergence with vLLM's margin at its first differing position
    (logprob of vLLM's token minus the tree engine's) against the drift the two engines showed
    on agreed tokens; a margin within DRIFT_FACTOR x the largest drift is a near-tie."""
    drifts = [drift(p, s) for p, s in zip(vllm_plain, tree_plain, strict=True)]
    threshold = DRIFT_FACTOR * max(drifts, default=0.0)
    lines, same = [], 0
    for p, s in zip(vllm_plain, tree_plain, strict=True):
        div = compare_greedy(p, s, threshold)
        if div is None:
            same += 1
            continue
        margin = (
            f"{div.margin:.4f}"
            if div.margin is not None
            else f">= {div.margin_bound:.3f} (not in vLLM's top 5)"
            if div.margin_bound is not None
            else "n/a"
        )
        lines.append(
            f"    {div.row_id}: first differs at token {div.position} (vLLM {div.plain_token}, "
            f"tree {div.spec_token}); vLLM margin {margin} nats, drift before it "
            f"{div.drift:.2e} -> {'near-tie' if div.near_tie else 'NOT a near-tie'}"
        )
    share = same / len(vllm_plain) if vllm_plain else float("nan")
    head = (
        f"  vLLM plain vs tree engine plain: identical {same}/{len(vllm_plain)} "
        f"({100 * share:.1f}%, target >= 95%); largest logprob drift on agreed tokens "
        f"{max(drifts, default=0.0):.2e}, near-tie threshold {threshold:.2e} nats"
    )
    return [head, *lines]


def committed(job: str, output: str, holdout: float, sets: list[str] = ()) -> tuple:
    """The job (with ``sets`` and its output directory), its committed rows (as ``distill``
    reads them) and the held-out ones (``distill``'s split: a fixed fraction by row id)."""
    from batchspec.io.layout import OutDir
    from batchspec.measure.distill import split
    from batchspec.measure.distill_data import committed_rows
    from batchspec.spec.file import load_spec

    spec = load_spec(job, [*sets, f"output.dir={output}"])
    rows, _ = committed_rows(spec, OutDir(spec.output_dir), None)
    return spec, rows, split(rows, holdout)[1]


class Tally:
    """Drafters replayed over finished greedy rows (``engines.tree.drafting.replay``: exact,
    the target's choices are the row's own tokens), added up per (domain, drafter) and over
    every domain as ``all``: output tokens after the first, target forwards (every step, one
    that drafted nothing a plain one), steps that drafted, and seconds spent drafting."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, str], list[float]] = {}

    def add(self, name: str, drafter: Any, row: Any, k: int, shape: Any) -> None:
        from batchspec.engines.tree.drafting import replay as drive

        started = time.perf_counter()
        got = drive(
            drafter, row.prompt, row.output, k, shape, len(row.output) + 1, domain=row.domain
        )
        took = time.perf_counter() - started
        tokens = len(row.output) - 1
        for key in ((str(row.domain), name), ("all", name)):
            s = self.sums.setdefault(key, [0, 0, 0, 0.0])
            for i, v in enumerate((tokens, tokens - sum(got.accepted), len(got.accepted), took)):
                s[i] += v

    def per_forward(self, domain: str, name: str) -> float:
        """Tokens per target forward: what speculation saves, whatever the drafter's hit rate."""
        s = self.sums.get((domain, name))
        return s[0] / s[1] if s and s[1] else float("nan")

    def per_step(self, domain: str, name: str) -> float:
        """Tokens per verify step that drafted (accepted + 1): the drafter's hit rate alone."""
        s = self.sums.get((domain, name))
        return (s[0] - s[1] + s[2]) / s[2] if s and s[2] else float("nan")

    def ms_per_forward(self, name: str) -> float:
        s = self.sums[("all", name)]
        return 1e3 * s[3] / max(s[1], 1)
