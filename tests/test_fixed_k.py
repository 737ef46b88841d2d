"""One rule decides whether a domain's K is fixed, and to what (``SpeculativeSpec.fixed_k``):
one table of cases drives it, and every place that acts on a fixed K (``k_for``, the
controller, ``KPolicy.decide``, the route's prediction) agrees with it. No engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import job_dict, write_job

from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.spec.file import load_spec
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import KPolicy
from batchspec.speculation.route import predicted_rate
from batchspec.speculation.tuning import BatchTuning, DomainTuning

CASES = [
    # (method, adaptive, per_domain, domain) -> the fixed K (None: the controller chooses)
    ("ngram", True, {}, "code", None),
    ("ngram", True, {"code": 5}, "code", 5),
    ("ngram", True, {"code": 0}, "code", 0),
    ("ngram", True, {"code": 5}, "math", None),
    ("ngram", True, {"code": 5}, None, None),
    ("ngram", False, {}, "code", 3),
    ("ngram", False, {"code": 5}, "code", 5),
    ("ngram", False, {"code": 5}, "math", 3),
    ("ngram", False, {}, None, 3),
    ("none", True, {}, "code", 0),
    ("none", False, {"code": 5}, "code", 0),
]
"""The spec's K (``num_speculative_tokens``) is 3 throughout."""


def spec_for(tmp_path: Path, method: str, adaptive: bool, per_domain: dict[str, int]) -> JobSpec:
    speculative = {
        "method": method,
        "adaptive": adaptive,
        "per_domain": per_domain,
        "num_speculative_tokens": 3,
        "k_grid": [0, 2, 3, 5],
    }
    job = job_dict(tmp_path / "out", speculative=speculative)
    return load_spec(write_job(tmp_path / "job.yaml", job))


@pytest.mark.parametrize(("method", "adaptive", "per_domain", "domain", "fixed"), CASES)
def test_the_rule_and_every_place_that_acts_on_it_agree(
    tmp_path: Path,
    method: str,
    adaptive: bool,
    per_domain: dict[str, int],
    domain: str | None,
    fixed: int | None,
) -> None:
    spec = spec_for(tmp_path, method, adaptive, per_domain)
    s = spec.speculative
    assert s.fixed_k(domain) == fixed
    # Where a domain starts: its fixed K, else the spec's K (the controller's start).
    assert s.k_for(domain) == (3 if fixed is None else fixed)
    # The controller and the policy: a fixed K whatever was measured. The measurements make
    # K=2 the fastest by far, so a domain the controller chooses for gets 2.
    policy = KPolicy(spec, OutDir(spec.output_dir), "w")
    for k, rate in ((0, 1.0), (2, 100.0), (3, 1.0), (5, 1.0)):
        policy.ctl.add(
            Observation(domain, k, 8, rows=100, output_tokens=10_000, running_s=10_000 / rate)
        )
    chosen = 2 if fixed is None else fixed
    assert policy.ctl.choose(domain).k == chosen
    _, ks = policy.ctl.table([domain])
    assert ks[0] == chosen
    assert policy.decide({domain: 100}, None).plan == {domain: chosen}
    # The route predicts the job at the K it runs at: fixed (when measured), else the
    # controller's choice in the tuning file (K=2 here). Each K has its own rate: k + 1.
    rates = {k: k + 1.0 for k in (0, 2, 3, 5)}
    entry = BatchTuning(
        batch=8,
        domains={str(domain): DomainTuning(chosen_k=2, tokens_per_s=rates)},
        observations=[Observation(domain, 2, 8, rows=10, output_tokens=100)],
    )
    rate, _ = predicted_rate(entry, {str(domain): 10}, spec)
    assert rate == pytest.approx(chosen + 1.0)
