"""What the distilled head's benchmark (``distill.py``) draws on, apart from what it measures:
the rows every configuration runs, job variants, one timed engine run, the figures drawn from
its rows (tokens/s, tokens per verify step, greedy identity), drafters replayed (``Tally``).

Everything runs through ``open_engine`` and ``Engine.run``, the calls the worker makes, so the
tree engine and vLLM are timed the same way: from the first unit handed over to the last
result back, engine start and shutdown excluded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from batchspec.engines import open_engine
from batchspec.measure.verify import run_rows
from batchspec.spec import JobSpec
from batchspec.spec.tree import TreeSpec
from batchspec.units import RowRequest, RowResult


@dataclass
class Sample:
    """The rows every configuration runs, as one unit."""

    unit: Any
    rows: list[RowRequest]


def variant(spec: JobSpec, batch: int, tree: dict[str, Any] | None, **speculative: Any) -> JobSpec:
    """The job at batch size ``batch``, with this tree shape (None: vLLM's chains) and these
    ``speculative`` keys, K fixed."""
    shape = TreeSpec(**tree) if tree is not None else None
    engine = "tree" if tree is not None else "vllm"
    update = {"tree": shape, "engine": engine, "adaptive": False, **speculative}
    model = spec.model.model_copy(update={"max_num_seqs": batch})
    return spec.model_copy(
        update={"speculative": spec.speculative.model_copy(update=update), "model": model}
    )


@dataclass
class Run:
    """One engine's pass over the sample: rows in sample order and the seconds it took."""

    label: str
    results: list[RowResult]
    seconds: float
    build_s: float
    parts: dict[str, float]
    """With ``run(split=True)``: seconds spent drafting and verifying."""

    @property
    def tokens(self) -> int:
        return sum(r.num_output_tokens or 0 for r in self.results)

    @property
    def rate(self) -> float:
        """Output tokens/s, prefill included, engine start excluded."""
        return self.tokens / self.seconds


def run(label: str, spec: JobSpec, k: int, smp: Sample, split: bool = False) -> Run:
    """Start the engine for ``spec`` and K, run the sample once, close the engine; ``split``:
    the seconds in its drafter's ``draft`` and its model's ``verify`` kept apart."""
    engine = open_engine(spec, k)
    try:
        model = getattr(engine, "model", None)
        calls = {"draft": getattr(engine, "drafter", None), "verify": model} if split else {}
        parts = timed_calls(calls)
        started = time.perf_counter()
        results = run_rows(engine, smp.unit, smp.rows)
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    by_id = {r.request.row_id: r for r in results}
    ordered = [by_id[r.row_id] for r in smp.rows]
    if errors := [f"{r.request.row_id}: {r.error}" for r in ordered if r.error is not None]:
        print(f"  {label}: ERROR rows: {errors[:3]}", flush=True)
    return Run(label, ordered, seconds, engine.build_s, parts)


def timed_calls(calls: dict[str, Any]) -> dict[str, float]:
    """Seconds spent in each ``obj.name`` from now on (``calls``: name to obj; None: not
    there), the method wrapped on the object."""
    spent = dict.fromkeys(calls, 0.0)
    for name, obj in calls.items():
        if obj is None:
            continue
        fn = getattr(obj, name)

        def timed(*args: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent[_name] += time.perf_counter() - started

        setattr(obj, name, timed)
    return spent


def per_step(results: list[RowResult]) -> float:
    """Mean tokens a verify step yields: 1 + accepted drafts / steps that verified drafts
    (the bonus token plus the accepted path)."""
    specs = [r.spec for r in results if r.spec]
    steps = sum(s.steps for s in specs)
    return 1 + sum(s.accepted for s in specs) / steps if steps else float("nan")


def differ(ref: list[RowResult], other: list[RowResult]) -> list[Any]:
    """The ids of the rows whose tokens differ between two runs (or that failed in either)."""
    pairs = zip(ref, other, strict=True)
    return [a.request.row_id for a, b in pairs if a.token_ids != b.token_ids or a.error or b.error]


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
    the target's choices are the row's own tokens), added up per (domain, drafter): output
    tokens after the first, target forwards (every step, one that drafted nothing a plain
    one) and steps that drafted."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, str], list[int]] = {}

    def add(self, name: str, drafter: Any, row: Any, k: int, shape: Any) -> None:
        """``drafter`` replayed over ``row`` (its ``prompt``, ``output`` and ``domain``, a row
        that stopped by itself: its budget one token past its output), added up."""
        from batchspec.engines.tree.drafting import replay as drive

        budget = len(row.output) + 1
        got = drive(drafter, row.prompt, row.output, k, shape, budget, domain=row.domain)
        tokens = len(row.output) - 1
        s = self.sums.setdefault((str(row.domain), name), [0, 0, 0])
        for i, v in enumerate((tokens, tokens - sum(got.accepted), len(got.accepted))):
            s[i] += v

    def per_forward(self, domain: str, name: str) -> float:
        """Tokens per target forward: what speculation saves, whatever the drafter's hit rate."""
        s = self.sums.get((domain, name))
        return s[0] / s[1] if s and s[1] else float("nan")

    def per_step(self, domain: str, name: str) -> float:
        """Tokens per verify step that drafted (accepted + 1): the drafter's hit rate alone."""
        s = self.sums.get((domain, name))
        return (s[0] - s[1] + s[2]) / s[2] if s and s[2] else float("nan")
