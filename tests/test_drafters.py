"""The drafter per domain (``speculation/drafters.py``) on made-up measurements: replayed
tokens per step of every model-free drafter on the same rows, a profiled step, each drafter's
measured drafting time, a model drafter's own measured acceptance; and the spec key's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import job_dict
from pydantic import ValidationError

from batchspec.spec import JobSpec
from batchspec.speculation.drafters import DrafterChoice, part_of
from batchspec.speculation.estimator import Observation

BATCH = 8
FIRST = {"ngram_first": True}
GRID = [0, 2, 4]


def step(k: int) -> float:
    """A profiled verify forward of 8 rows: 10 ms plain, 2 ms more per draft node."""
    return 0.010 + 0.002 * k


def replays(tokens: int, **accepted: tuple[int, int]) -> dict[str, list[list[int]]]:
    """Per drafter, ``[K, tokens, accepted]`` at K = 0, 2, 4 (accepted at 2 and 4)."""
    return {
        d: [[0, tokens, 0], [2, tokens, a2], [4, tokens, a4]] for d, (a2, a4) in accepted.items()
    }


def ob(
    domain: str, k: int, drafter: str, tokens: int = 1000, running_s: float = 0.0, **kw
) -> Observation:
    return Observation(
        domain, k, BATCH, rows=10, output_tokens=tokens, running_s=running_s, drafter=drafter, **kw
    )


def choice(drafters: list[str], method: str, drafting: dict[str, float]) -> DrafterChoice:
    c = DrafterChoice(drafters, method, BATCH, GRID, default_k=4)
    c.price(step, drafting.get)
    return c


def test_each_domain_gets_the_drafter_and_k_its_replays_and_costs_price_fastest() -> None:
    c = choice(["ngram", "suffix"], "ngram", {"ngram": 1e-5, "suffix": 3e-5})
    # Nothing measured: the method, blind (``blind_k``): a step at K=2 costs 40 % more than
    # a plain one, so plain; where a verify costs what a plain step does, the spec's K=4.
    assert c.choose("json")[:3] == ("ngram", 0, None)
    flat = DrafterChoice(["ngram", "suffix"], "ngram", BATCH, GRID, default_k=4)
    flat.price(lambda k: 0.010, {"ngram": 1e-5}.get)
    assert flat.choose("json")[:3] == ("ngram", 4, None)
    # The same rows replayed by both drafters (the unit ran n-gram trees at K=4).
    c.add(ob("json", 4, "ngram", replays=replays(1000, ngram=(200, 250), suffix=(400, 500))))
    c.add(ob("chat", 4, "ngram", replays=replays(1000, ngram=(10, 12), suffix=(15, 18))))
    pick = c.choose("json")
    # suffix at K=2: 1000 / 600 tokens a step in 14 ms + 8 rows x 30 us = 117.0 tokens/s a row,
    # beating suffix at K=4 (109.6), plain decoding (100.0) and n-gram at its best (88.8).
    assert (pick.drafter, pick.k) == ("suffix", 2)
    assert pick.rate == pytest.approx(1000 / 600 / (0.014 + 8 * 3e-5))
    assert pick.options["ngram"][2] == pytest.approx(1000 / 800 / (0.014 + 8 * 1e-5))
    assert pick.options["suffix"][0] == pick.options["ngram"][0] == pytest.approx(100.0)
    # Drafts that rarely land: plain decoding, recorded as the method's (K=0 drafts nothing).
    assert c.choose("chat")[:2] == ("ngram", 0)
    # A domain not seen yet starts blind (plain here), though json's replay, all that was
    # seen, says suffix at K=2; where a verify costs a plain step, blind is the spec's K=4.
    seen = choice(["ngram", "suffix"], "ngram", {"ngram": 1e-5, "suffix": 3e-5})
    seen.add(ob("json", 4, "ngram", replays=replays(1000, ngram=(200, 250), suffix=(400, 500))))
    assert seen.choose("json")[:2] == ("suffix", 2)
    assert seen.choose("code")[:3] == ("ngram", 0, None)
    flat.add(ob("json", 4, "ngram", replays=replays(1000, ngram=(0, 0), suffix=(0, 0))))
    assert flat.choose("code")[:3] == ("ngram", 4, None)  # not json's plain
    assert c.plan(["json", "chat"]) == ({"json": 2, "chat": 0}, {"json": "suffix", "chat": "ngram"})


def test_a_model_drafter_is_priced_by_its_own_acceptance_and_measured_drafting_time() -> None:
    """EAGLE accepts far more than n-gram trees here, so it wins while its head costs 1 ms a
    row; at 20 ms a row its steps cost more than its tokens give, and n-gram trees win. Before
    it ran in a domain nothing prices it there (its acceptance is not replayable)."""
    accepted = {"accepted": 900, "rejections": 100, "spec_steps": 200, "decode_steps": 200}
    units = [
        ob("math", 4, "ngram", replays=replays(1000, ngram=(400, 500))),
        ob("math", 4, "eagle3", replays=replays(1000, ngram=(400, 500)), **accepted),
    ]
    fresh = choice(["ngram", "eagle3"], "eagle3", {"ngram": 1e-5, "eagle3": 1e-3})
    fresh.add(units[0])
    assert set(fresh.choose("math").options["eagle3"]) == {0}  # never ran: only plain priced
    for per_row, expected in ((1e-3, "eagle3"), (2e-2, "ngram")):
        c = choice(["ngram", "eagle3"], "eagle3", {"ngram": 1e-5, "eagle3": per_row})
        for u in units:
            c.add(u)
        pick = c.choose("math")
        assert pick.drafter == expected, pick
    # Its price is measured, not assumed: without a measured drafting time, no K > 0 priced.
    c = choice(["ngram", "eagle3"], "eagle3", {"ngram": 1e-5})
    for u in units:
        c.add(u)
    assert set(c.choose("math").options["eagle3"]) == {0}


def test_a_domains_measured_rates_scale_every_drafters_predictions_alike() -> None:
    """n-gram trees ran at K=4 at half their predicted rate (long prompts); suffix trees never
    ran, and replay says they give 5 % fewer tokens a step. Scaled by the same measurement,
    n-gram trees stay ahead; scaled by its own (none), suffix trees would look 1.9x faster."""
    c = choice(["ngram", "suffix"], "ngram", {"ngram": 1e-5, "suffix": 1e-5})
    predicted = 2000 / 800 / (step(4) + 8e-5)
    c.add(
        ob("long", 4, "ngram", tokens=2000, running_s=2000 / (predicted / 2),
           replays=replays(2000, ngram=(700, 1200), suffix=(665, 1140)))
    )  # fmt: skip
    pick = c.choose("long")
    assert (pick.drafter, pick.k) == ("ngram", 4), pick
    assert pick.rate == pytest.approx(predicted / 2)  # measured
    assert pick.options["suffix"][4] == pytest.approx(2000 / 860 / (step(4) + 8e-5) / 2)


def test_an_observation_is_split_by_drafter() -> None:
    """A unit's replays go to every drafter; its measured rate to its own, or to all at K=0."""
    ran = ob("a", 4, "suffix", running_s=5.0, replays=replays(100, ngram=(1, 2), suffix=(3, 4)))
    own, other = part_of(ran, "suffix", "ngram"), part_of(ran, "ngram", "ngram")
    assert own is not None and own.batch == BATCH and own.replay[2] == [4, 100, 4]
    assert other is not None and other.batch == -1 and other.replay[2] == [4, 100, 2]
    plain = ob("a", 0, "ngram", running_s=5.0)
    assert part_of(plain, "suffix", "ngram").batch == BATCH  # type: ignore[union-attr]
    assert part_of(ob("a", 4, "ngram"), "suffix", "ngram") is None


@pytest.mark.parametrize(
    ("speculative", "needle"),
    [
        ({"drafters": ["ngram", "suffix"]}, "needs engine: tree"),
        ({"engine": "tree", "adaptive": False, "drafters": ["ngram", "suffix"]}, "adaptive: true"),
        ({"engine": "tree", "drafters": ["suffix"]}, r"method ngram \(where each domain starts\)"),
        ({"engine": "tree", "drafters": ["ngram", "ngram"]}, "distinct"),
        (
            {"engine": "tree", "drafters": ["ngram", "draft_model", "eagle3"], "model": "/m"},
            "one model drafter",
        ),
        ({"engine": "tree", "drafters": ["ngram", "eagle3"]}, "eagle3 needs speculative.model"),
        ({"engine": "tree", "drafters": ["ngram", "mtp"]}, "drafters"),
        (
            {"engine": "tree", "drafters": ["ngram", "eagle3"], "model": "/m", "tree": FIRST},
            r"eagle3\+ngram \(n-gram trees first\) instead of tree.ngram_first",
        ),
    ],
)
def test_the_spec_key_is_refused_where_no_choice_can_be_made(
    speculative: dict, needle: str
) -> None:
    with pytest.raises(ValidationError, match=needle):
        JobSpec.model_validate(job_dict(Path("o"), speculative=speculative))


def test_a_model_drafters_keys_serve_it_beside_the_ngram_method() -> None:
    drafters = ["ngram", "suffix", "draft_model", "draft_model+ngram"]
    spec = {"engine": "tree", "drafters": drafters, "tree": {"draft_layers": [0, 1]}}
    s = JobSpec.model_validate(job_dict(Path("o"), speculative=spec)).speculative
    assert s.method == "ngram" and s.drafters == drafters


def test_the_policy_and_scheduler_give_each_unit_its_domains_drafter(tmp_path: Path) -> None:
    """A tree engine with several drafters (a profile and measured drafting, doubles): the
    K policy decides a drafter per domain beside its K, and the scheduler hands each unit
    both (``unit_k``, ``unit_drafter``: what ``UnitKFeed`` puts on the unit's requests)."""
    from conftest import write_job

    from batchspec.io.layout import OutDir
    from batchspec.spec.file import load_spec
    from batchspec.speculation.policy import KPolicy
    from batchspec.units import WorkUnit
    from batchspec.work.scheduler import Scheduler

    speculative = {"engine": "tree", "drafters": ["ngram", "suffix"], "k_grid": GRID}
    job = job_dict(tmp_path / "out", speculative=speculative)
    policy = KPolicy(
        load_spec(write_job(tmp_path / "job.yaml", job)), OutDir(tmp_path / "out"), "w"
    )
    drafting = {"ngram": 1e-5, "suffix": 3e-5}  # measured per row and step (a double: no torch)
    costs = type("Costs", (), {"per_row": lambda self, d: drafting.get(d),
                               "summary": lambda self: drafting})()  # fmt: skip
    profile = type("Profile", (), {"seconds": lambda self, b, k: step(k)})()
    policy.engine_up(type("Tree", (), {"k_per_unit": True, "step_profile": profile,
                                       "draft_costs": costs})())  # fmt: skip
    policy.observe(
        ob("json", 4, "ngram", replays=replays(1000, ngram=(200, 250), suffix=(400, 500)))
    )
    policy.observe(ob("chat", 4, "ngram", replays=replays(1000, ngram=(10, 12), suffix=(15, 18))))
    decision = policy.decide({"json": 10, "chat": 10}, 4)
    assert decision.plan == {"json": 2, "chat": 0}
    assert decision.drafters == {"json": "suffix", "chat": "ngram"}
    units = [WorkUnit(0, "x", i, i + 1, d, 1) for i, d in enumerate(["chat", "json"])]
    sched = Scheduler(units, policy)
    _, first = sched.next_engine(4)
    second = sched.next_unit(4)
    assert [(sched.unit_k(u), sched.unit_drafter(u)) for u in (first, second)] == [
        (0, "ngram"), (2, "suffix")
    ]  # fmt: skip
    steps = json.loads((tmp_path / "out" / "stats" / "steps-w.json").read_text())
    assert steps["drafting"] == {"ngram": pytest.approx(1e-5), "suffix": pytest.approx(3e-5)}
