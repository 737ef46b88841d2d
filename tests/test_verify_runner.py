"""Which engines ``batchspec verify`` opens for which rows: the job's K per domain (or one
``--k`` for all), domains without speculation left out, results paired row by row. The
engines are doubles here (orchestration only); test_verify.py runs real vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import small_job

from batchspec.errors import UserError
from batchspec.measure import verify as verify_mod
from batchspec.spec.file import load_spec
from batchspec.units import RowResult


class EchoEngine:
    """Answers every row with its own id and the engine's K, in the rows' order."""

    method = "ngram"
    build_s = 0.0
    max_model_len = 1024

    def __init__(self, opened: list[tuple[int, list[str]]], k: int):
        self.k, self.opened = k, opened

    def run(self, source: Any, should_abort: Any) -> Any:
        while (unit := source.next_unit()) is not None:
            self.opened.append((self.k, sorted({r.domain for r in unit.rows})))
            results = [RowResult(r, text=f"{r.row_id}@{self.k}") for r in unit.rows]
            yield type("Done", (), {"results": results})()

    def close(self) -> None:
        return None


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[str]]]:
    log: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(verify_mod, "open_engine", lambda spec, k, lp: EchoEngine(log, k))
    return log


def runner(tmp_path: Path, k: int | None = None, **per_domain: int) -> verify_mod._Runner:
    spec = load_spec(small_job(tmp_path, 2, speculative={"per_domain": per_domain}))
    return verify_mod._Runner(spec, 12, k, print)


def test_each_domain_runs_at_its_own_k(tmp_path: Path, opened: list) -> None:
    r = runner(tmp_path, math=5, qa=0)
    plain, spec = r.both(r.spec, copies=2)
    assert "qa" not in r.quota and r.ks["math"] == 5 and r.ks["code"] == 3
    ks = {k: doms for k, doms in opened if k}
    # The main pass runs each row once, then its copies.
    assert opened[0][0] == 0 and "qa" not in opened[0][1]
    assert ks[5] == ["math"] and "math" not in ks[3] and "qa" not in ks[3]
    assert len(plain) == len(spec) == 2 * sum(r.quota.values())
    for p, s in zip(plain, spec, strict=True):
        assert p.request.row_id == s.request.row_id
        assert s.text == f"{s.request.row_id}@{r.ks[s.request.domain]}"


def test_one_k_for_every_domain(tmp_path: Path, opened: list) -> None:
    r = runner(tmp_path, 2, math=5)
    r.both(r.spec)
    assert {k for k, _ in opened} == {0, 2}


def test_nothing_to_verify_when_every_domain_is_off(tmp_path: Path) -> None:
    zero = dict.fromkeys(["chat", "code", "math", "qa", "summarization", "translation"], 0)
    with pytest.raises(UserError, match="nothing to verify"):
        runner(tmp_path, **zero)


def test_sampled_rows_are_cut_to_the_tested_tokens_min_tokens_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampled check generates only its first ``tokens``: every row's ``max_tokens`` (the
    job's and a column's) is cut to them, and ``min_tokens`` with it (vLLM refuses a
    ``min_tokens`` above ``max_tokens``; below either bound end-of-sequence is masked alike)."""
    import polars as pl

    sampling = {"temperature": 1.0, "max_tokens": 64, "min_tokens": 16}
    job = small_job(tmp_path, 2, sampling=sampling | {"columns": {"max_tokens": "mt"}})
    data = tmp_path / "in.parquet"
    pl.read_parquet(data).with_columns(pl.lit(48).alias("mt")).write_parquet(data)
    seen: list[Any] = []

    class Recording(EchoEngine):
        def run(self, source: Any, should_abort: Any) -> Any:
            while (unit := source.next_unit()) is not None:
                seen.extend(r.sampling for r in unit.rows)
                yield type("Done", (), {"results": [RowResult(r) for r in unit.rows]})()

    def opening(spec: Any, k: int, lp: Any) -> EchoEngine:
        seen.append(spec.sampling)
        return Recording([], k)

    monkeypatch.setattr(verify_mod, "open_engine", opening)
    monkeypatch.setattr(verify_mod, "sampled_check", lambda *a: {})
    r = verify_mod._Runner(load_spec(job), 6, None, print)
    verify_mod.verify_sampled(r, samples=2, tokens=4, alpha=0.05)
    assert seen and all(s is not None for s in seen)
    assert {(s.max_tokens, s.min_tokens) for s in seen} == {(4, 4)}


def test_a_check_of_runs_that_accepted_no_draft_is_inconclusive_not_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain and speculative rows identical, but the speculative engine accepted no draft
    token: nothing speculation could change was tested, and verify must not say pass. Drafts
    accepted in some domains make the same identical rows a pass that lists the others."""
    from batchspec.units import SpecStats

    accepted = [0]

    class Identical(EchoEngine):
        def run(self, source: Any, should_abort: Any) -> Any:
            while (unit := source.next_unit()) is not None:
                results = []
                for r in unit.rows:
                    n = accepted[0] if r.domain != "math" else 0
                    spec = SpecStats(1, 4, n, (1 - n, n)) if self.k else None
                    results.append(RowResult(r, "x", 3, 2, "length", token_ids=[5, 6], spec=spec))
                yield type("Done", (), {"results": results})()

    monkeypatch.setattr(verify_mod, "open_engine", lambda spec, k, lp: Identical([], k))
    spec = load_spec(small_job(tmp_path, 2))
    report = verify_mod.verify(spec, 6, 2, 2, 0.05, None, print)
    assert report["checks"][0]["passed"] and report["drafts_accepted"] == 0
    assert report["inconclusive"] and not report["passed"]
    accepted[0] = 1  # in every domain but math: a pass that names math as untested
    report = verify_mod.verify(spec, 6, 2, 2, 0.05, None, print)
    assert report["passed"] and not report["inconclusive"] and report["drafts_accepted"] > 0
    assert report["domains_without_drafts"] == ["math"]
