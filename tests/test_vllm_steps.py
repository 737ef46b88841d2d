"""vLLM's step costs fitted from its steps (``engines.vllm_steps``): exact on steps made from
known costs, the terms that the steps seen cannot separate tied as documented, waits for work
left out, and earlier runs' sums a bounded prior. The fit on real vLLM steps: the K benchmark
(``scripts/bench/k_choice.py``) and ``tests/test_e2e.py``'s run files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from batchspec.engines.vllm_steps import IDLE_S, MIN_STEPS, PRIOR_STEPS, StepCosts

TRUE = {"step": 0.004, "rows": 0.0015, "spec_rows": 0.0003, "drafted": 0.0004, "prefill": 0.00002}


def cost(k: int, rows: int, drafted: int, prefill: int) -> float:
    spec_rows = rows if k > 0 else 0
    t = TRUE
    return (
        t["step"]
        + t["rows"] * rows
        + t["spec_rows"] * spec_rows
        + t["drafted"] * drafted
        + t["prefill"] * prefill
    )


def feed(costs: StepCosts, k: int, steps: int, seed: int, noise: float = 0.0) -> None:
    """Steps of an engine at ``k``: batches filling and draining, drafts of every length."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = int(rng.integers(1, 17))
        drafted = int(rng.integers(0, rows * k + 1)) if k else 0
        prefill = int(rng.choice([0, 0, 0, int(rng.integers(20, 400))]))
        t = cost(k, rows, drafted, prefill) * (1 + noise * rng.standard_normal())
        costs.record(t, k, rows, rows + drafted, prefill)


def test_both_kinds_of_steps_give_every_cost_exactly() -> None:
    costs = StepCosts()
    feed(costs, 0, 60, seed=1)
    feed(costs, 4, 60, seed=2)
    coef = costs.coefficients()
    assert coef is not None
    assert np.allclose(coef, list(TRUE.values()), rtol=1e-6, atol=1e-12)
    fill = costs.fill()
    assert costs.seconds(16, 0) == pytest.approx(cost(0, 16, 0, 0), rel=1e-6)
    assert costs.seconds(16, 8) == pytest.approx(cost(8, 16, 16 * fill * 8, 0), rel=1e-6)
    assert costs.spread(16, 3) == pytest.approx(0.0, abs=1e-9)  # no noise: no spread


def test_speculative_steps_alone_price_k0_as_a_spec_step_that_drafted_nothing() -> None:
    # The proposer's cost per row cannot be told apart from a row's cost: it stays in the
    # row's, so K=0 is priced high by that much (toward speculation), until a K=0 engine ran.
    costs = StepCosts()
    feed(costs, 3, 80, seed=3)
    plain = TRUE["step"] + (TRUE["rows"] + TRUE["spec_rows"]) * 16
    assert costs.seconds(16, 0) == pytest.approx(plain, rel=1e-6)
    coef = dict(zip(("step", "rows", "spec_rows", "drafted"), costs.coefficients(), strict=False))
    assert coef["spec_rows"] == 0 and coef["drafted"] == pytest.approx(TRUE["drafted"], rel=1e-6)


def test_plain_steps_alone_price_a_drafted_token_as_a_prefill_token() -> None:
    costs = StepCosts()
    feed(costs, 0, 80, seed=4)
    coef = costs.coefficients()
    assert coef is not None and coef[3] == pytest.approx(TRUE["prefill"], rel=1e-6)
    assert costs.fill() == 1.0  # no drafts seen: a draft fills its K slots
    assert costs.seconds(16, 4) == pytest.approx(cost(0, 16, 0, 0) + 64 * TRUE["prefill"])


def test_rows_asking_for_different_k_fill_the_slots_they_asked_for() -> None:
    """In an engine that takes K per row (``vllm_live_k``) a step drafts at the largest K in
    it: half the rows at K=4 drafting fully and half at K=0 fill their drafts completely,
    not half of 4 slots a row (which would price K=4 as if n-gram found half the matches)."""
    costs = StepCosts()
    for rows in range(2, 18, 2):
        drafted = rows // 2 * 4
        costs.record(cost(4, rows, drafted, 0), 4, rows, rows + drafted, 0, slots=rows * 2.0)
    assert costs.fill(4) == 1.0 and costs.fill() == 1.0
    plain = StepCosts()  # the same steps read as every row at the step's K
    for rows in range(2, 18, 2):
        drafted = rows // 2 * 4
        plain.record(cost(4, rows, drafted, 0), 4, rows, rows + drafted, 0)
    assert plain.fill(4) == 0.5


def test_a_longer_k_is_never_priced_below_a_shorter_one() -> None:
    """Each K's fill is read from the steps nearest it: K=2's steps drafted 2 a row, K=8's
    only 1 (n-gram ran out of matches); K=8 is priced with 2 drafts a row, not 1."""
    costs = StepCosts()
    for rows in range(1, 17):
        for k, per_row in ((0, 0), (2, 2), (8, 1)):
            drafted = rows * per_row
            costs.record(cost(k, rows, drafted, 0), k, rows, rows + drafted, 0)
    assert costs.fill(8) * 8 == pytest.approx(1.0) and costs.fill(2) * 2 == pytest.approx(2.0)
    assert costs.features(16, 8)[3] == pytest.approx(32.0)
    priced = [costs.seconds(16, k) for k in range(9)]
    assert priced == sorted(priced)


def test_no_cost_is_negative_and_waits_for_work_are_left_out() -> None:
    costs = StepCosts()
    assert math.isnan(costs.seconds(16, 3))  # nothing before MIN_STEPS
    rng = np.random.default_rng(5)
    for _ in range(MIN_STEPS * 3):
        rows = int(rng.integers(1, 17))
        # Rows cost, a constant 10 ms, and prefill tokens seemingly *save* time (noise).
        t = 0.010 + 0.002 * rows - 0.00001 * (prefill := int(rng.integers(0, 50)))
        costs.record(t, 0, rows, rows, prefill)
    coef = costs.coefficients()
    assert coef is not None and (coef >= 0).all() and coef[4] == 0.0
    step = costs.seconds(16, 0)
    assert step == pytest.approx(0.010 + 0.032, rel=0.05)
    costs.record(5.0, 0, 16, 16, 0)  # the core waited for work: 5 s of a 42 ms step
    assert costs.skipped == 1
    costs.record(3 * step + IDLE_S * 0.5, 0, 16, 16, 0)  # within the bound: kept
    assert costs.skipped == 1


def test_measured_against_fitted_per_engine_k() -> None:
    costs = StepCosts()
    feed(costs, 0, 40, seed=6, noise=0.05)
    feed(costs, 5, 40, seed=7, noise=0.05)
    summary = costs.summary(16, [0, 2, 5])
    by_k = summary["by_engine_k"]
    assert set(by_k) == {0, 5} and summary["steps"] == 80
    for entry in by_k.values():
        assert entry["fitted_s"] == pytest.approx(entry["measured_s"], rel=0.05)
    seconds, spread = summary["priced"][2]
    assert seconds > 0 and 0 < spread < 0.1 * seconds


def test_earlier_runs_are_a_prior_worth_at_most_prior_steps(tmp_path: Path) -> None:
    path = tmp_path / "steps.json"
    first = StepCosts("k", path)
    feed(first, 4, PRIOR_STEPS * 3, seed=8)
    first.save()
    second = StepCosts("k", path)
    second.load_prior()
    assert second.n == pytest.approx(PRIOR_STEPS)
    assert second.seconds(16, 4) == pytest.approx(first.seconds(16, 4), rel=1e-9)
    feed(second, 4, 10, seed=9)
    assert second.summary(16, [4])["steps"] == 10
    path.write_text("{not json")
    third = StepCosts("k", path)
    third.load_prior()  # unreadable: no prior, no error
    assert third.n == 0


def test_k_is_priced_at_the_rows_the_steps_carry(tmp_path: Path) -> None:
    """A GPU's KV cache (or the rows left) can hold a batch below ``max_num_seqs``: steps
    of 1 to 16 rows (8.5 on average) at max_num_seqs 64 price K at 8.5 rows, and so does the
    policy; before ``MIN_STEPS`` steps, at 64."""
    from types import SimpleNamespace

    from conftest import job_dict

    from batchspec.io.layout import OutDir
    from batchspec.spec import JobSpec
    from batchspec.speculation.policy import KPolicy

    costs = StepCosts()
    feed(costs, 4, MIN_STEPS - 1, seed=7)
    assert costs.rows(64) == 64
    feed(costs, 0, 200, seed=8)
    rows = costs.decode_rows[1] / costs.decode_rows[0]
    assert costs.rows(64) == pytest.approx(rows) and 7.5 < rows < 9.5
    assert costs.rows(4) == 4  # never above max_num_seqs
    assert costs.summary(64, [0, 4])["priced"][4][0] == pytest.approx(costs.seconds(rows, 4))
    spec = JobSpec.model_validate(job_dict(tmp_path / "out", model={"max_num_seqs": 64}))
    policy = KPolicy(spec, OutDir(tmp_path / "out"), "w")
    policy.engine_up(SimpleNamespace(k_per_unit=True, step_profile=costs))
    assert policy.ctl.step_cost(4) == pytest.approx(costs.seconds(rows, 4))
    assert policy.ctl.fill_cost(4, 0.5) == pytest.approx(costs.seconds_at(rows, 4, 0.5))
