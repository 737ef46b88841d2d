"""``SpecStats``, the typed per-row speculative counts: read from vLLM's per-request metrics in
both their forms, and what its readers derive from it (no engine)."""

from __future__ import annotations

import dataclasses

import pytest

from batchspec.speculation.estimator import rejected_steps
from batchspec.units import SpecStats

DETAILED = {
    "mean_acceptance_length": 2.333333333333333,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": [1, 0, 2, 0],
    "num_spec_steps": 3,
    "num_accepted_draft_tokens": 4,
    "num_draft_tokens": 8,
    "num_spec_tokens": 3,
    "per_step_accepted": [2, 0, 2],
    "per_step_drafted": [3, 3, 2],
}
"""``RequestSpecDecodeMetrics.to_dict()`` of vLLM 0.32 at ``detailed``, as printed after three
verify steps of ``RequestSpecDecodeMetrics.new(3)`` drafting 3, 3 and 2 tokens and accepting 2,
0 and 2."""
SUMMARY = {k: v for k, v in DETAILED.items() if not k.startswith("per_step_")}
"""The same steps at ``summary``, as printed: no per-step lists."""
NO_STEP = SUMMARY | {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0}
NO_STEP |= {"acceptance_histogram": [0, 0, 0, 0], "num_spec_steps": 0}
NO_STEP |= {"num_accepted_draft_tokens": 0, "num_draft_tokens": 0}
"""A row that never drafted, as printed in either form (``detailed`` lists only populated steps):
the same keys, every count 0."""


def test_from_vllm_reads_the_detailed_form() -> None:
    s = SpecStats.from_vllm(DETAILED)
    assert (s.steps, s.drafted, s.accepted, s.histogram) == (3, 8, 4, (1, 0, 2, 0))
    assert (s.per_step_drafted, s.per_step_accepted) == ((3, 3, 2), (2, 0, 2))


def test_from_vllm_reads_the_summary_form() -> None:
    s = SpecStats.from_vllm(SUMMARY)
    assert (s.steps, s.drafted, s.accepted, s.histogram) == (3, 8, 4, (1, 0, 2, 0))
    assert s.per_step_drafted is None and s.per_step_accepted is None


def test_from_vllm_takes_per_step_lists_only_as_a_pair() -> None:
    half = {k: v for k, v in DETAILED.items() if k != "per_step_accepted"}
    s = SpecStats.from_vllm(half)
    assert s.per_step_drafted is None and s.per_step_accepted is None


def test_the_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SpecStats.from_vllm(DETAILED).steps = 4  # type: ignore[misc]


def test_derived_figures() -> None:
    s = SpecStats.from_vllm(DETAILED)
    assert s.acceptance_rate == DETAILED["draft_acceptance_rate"]
    assert s.mean_acceptance_length == pytest.approx(DETAILED["mean_acceptance_length"])
    # vLLM says 0.0 and 1.0 for a row that drafted nothing; the output columns say null.
    nothing = SpecStats.from_vllm(NO_STEP)
    assert (nothing.steps, nothing.drafted, nothing.per_step_drafted) == (0, 0, None)
    assert nothing.acceptance_rate is None and nothing.mean_acceptance_length is None


def test_rejected_steps_exact_from_per_step_counts_and_bounded_from_the_summary() -> None:
    """Detailed: the two steps that accepted fewer than they drafted (the third drafted 2 and
    accepted both: a short draft taken whole, no failure). Summary: min(drafted - accepted,
    steps below the top bucket) = min(4, 3) = 3, the bound the estimator used before."""
    assert rejected_steps(SpecStats.from_vllm(DETAILED)) == 2
    assert rejected_steps(SpecStats.from_vllm(SUMMARY)) == 3
    assert rejected_steps(SpecStats.from_vllm(NO_STEP)) == 0
    full = SpecStats(steps=2, drafted=6, accepted=6, histogram=(0, 0, 0, 2))
    assert rejected_steps(full) == 0
