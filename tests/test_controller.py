"""The K controller's estimator and chooser, on synthetic measurements with known truth."""

from __future__ import annotations

import random

import pytest

from batchspec.speculation.controller import BLIND_LOSS, Controller, blind_k
from batchspec.speculation.estimator import DomainModel, Observation, expected_tokens


def draw_histogram(alpha: float, k: int, steps: int, rng: random.Random) -> list[int]:
    """Verify steps with K drafts, each accepted with probability alpha until one fails."""
    hist = [0] * (k + 1)
    for _ in range(steps):
        j = 0
        while j < k and rng.random() < alpha:
            j += 1
        hist[j] += 1
    return hist


def observation(domain: str, k: int, hist: list[int], rate: float, batch: int = 8) -> Observation:
    accepted = sum(j * c for j, c in enumerate(hist))
    steps = sum(hist)
    tokens = steps + accepted
    return Observation(
        domain,
        k,
        batch,
        rows=50,
        output_tokens=tokens,
        running_s=tokens / rate,
        accepted=accepted,
        rejections=sum(hist[:-1]),
        spec_steps=steps,
        decode_steps=steps,
    )


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_estimator_recovers_alpha(alpha: float, k: int) -> None:
    rng = random.Random(int(alpha * 100) + k)
    hist = draw_histogram(alpha, k, 4000, rng)
    ob = observation("d", k, hist, rate=10.0)
    model = DomainModel(ob.accepted, ob.rejections, ob.spec_steps, ob.decode_steps)
    # Tolerance: four posterior standard deviations, and never looser than 0.03.
    assert abs(model.alpha - alpha) <= min(0.03, 4 * model.alpha_std), (model.alpha, alpha)
    assert model.alpha_std < 0.02


def test_estimator_pools_histograms_of_different_k() -> None:
    rng = random.Random(7)
    ctl = Controller(8, [0, 1, 3, 5], default_k=3)
    for k in (1, 3, 5):
        ctl.add(observation("d", k, draw_histogram(0.6, k, 3000, rng), rate=10.0))
    assert ctl.domain_model("d").alpha == pytest.approx(0.6, abs=0.02)


def costs_observations(
    alpha: float, step_time, grid: list[int], domain: str = "d", steps: int = 20000
) -> list[Observation]:
    """Observations of one domain whose rates follow the model with this step cost per K."""
    obs = []
    for k in grid:
        if k == 0:
            hist, tps = [steps], 1.0
            obs.append(
                Observation(
                    domain,
                    0,
                    8,
                    rows=50,
                    output_tokens=steps,
                    running_s=steps * step_time(0),
                    decode_steps=steps,
                )
            )
            continue
        hist = [round(steps * alpha**j * (1 - alpha)) for j in range(k)] + [round(steps * alpha**k)]
        tps = expected_tokens(alpha, k)
        obs.append(observation(domain, k, hist, rate=tps / step_time(k)))
    return obs


def test_chooses_no_speculation_when_steps_cost_too_much() -> None:
    grid = [0, 1, 2, 3, 5, 8]
    ctl = Controller(64, grid, default_k=3)
    # Large batch: each draft token costs 60% of a plain step; acceptance 0.5.
    for ob in costs_observations(0.5, lambda k: 1.0 + 0.6 * k, grid):
        ob.batch = 64
        ctl.add(ob)
    choice = ctl.choose("d")
    assert choice.k == 0
    assert choice.rates[0] > max(r for k, r in choice.rates.items() if k)


def test_chooses_long_drafts_when_they_are_cheap_and_accepted() -> None:
    grid = [0, 1, 2, 3, 5, 8]
    ctl = Controller(8, grid, default_k=3)
    for ob in costs_observations(0.9, lambda k: 1.0 + 0.02 * k, grid):
        ctl.add(ob)
    assert ctl.choose("d").k == 8


def test_k_between_measured_points_is_interpolated_never_extrapolated() -> None:
    ctl = Controller(8, [0, 1, 2, 3, 5, 8], default_k=3)
    for ob in costs_observations(0.7, lambda k: 1.0 + 0.1 * k, [1, 3]):
        ctl.add(ob)
    rates = ctl.choose("d").rates
    assert set(rates) == {1, 2, 3}  # 2 interpolated; 0, 5 and 8 are not measured
    assert rates[2] == pytest.approx(
        expected_tokens(ctl.domain_model("d").alpha, 2) / 1.2, rel=0.02
    )


def test_a_domains_own_rates_set_the_level_of_its_predicted_ones() -> None:
    ctl = Controller(8, [0, 3], default_k=3)
    for ob in costs_observations(0.5, lambda k: 1.0 + 0.2 * k, [0, 3], domain="short"):
        ctl.add(ob)
    # "long" decodes 4x slower (long prompts); only its K=0 is measured long enough.
    ctl.add(
        Observation("long", 0, 8, rows=50, output_tokens=4000, running_s=16000.0, decode_steps=4000)
    )
    hist = [50, 25, 13, 12]  # about alpha 0.5, too few tokens for a rate of its own
    ctl.add(observation("long", 3, hist, rate=0.25 * expected_tokens(0.5, 3) / 1.6))
    rates = ctl.choose("long").rates
    assert rates[0] == pytest.approx(0.25)
    # K=3 is predicted at long's own level, not at the pooled one (which would make it ~4x
    # faster than long's measured K=0 and always win), with the model's ratio to K=0.
    model = ctl.domain_model("long")
    steps = ctl.step_times()
    ratio = model.tokens_per_step(3) / steps[3] / (1.0 / steps[0])
    assert rates[3] == pytest.approx(0.25 * ratio, rel=0.01)
    assert rates[3] < 0.5


def test_without_measurements_keeps_the_spec_k_and_fixed_domains_stay() -> None:
    ctl = Controller(8, [0, 1, 3], default_k=3, fixed={"math": 0}.get)
    assert ctl.choose("code").k == 3
    for ob in costs_observations(0.9, lambda k: 1.0 + 0.01 * k, [0, 1, 3], domain="math"):
        ctl.add(ob)
    assert ctl.choose("math").k == 0


def test_other_batch_sizes_are_ignored() -> None:
    ctl = Controller(8, [0, 3], default_k=3)
    for ob in costs_observations(0.1, lambda k: 1.0 + 0.9 * k, [0, 3]):
        ob.batch = 64
        ctl.add(ob)
    assert ctl.obs == {} and ctl.choose("d").k == 3


def policy_with_rates(tmp_path, rates: dict[tuple[str, int], float], **per_domain: int):
    """An adaptive policy at batch 8 whose domains decode at these measured rates per K
    (100 tokens per row); ``per_domain``: domains whose K the job fixes."""
    from conftest import job_dict, write_job

    from batchspec.io.layout import OutDir
    from batchspec.spec.file import load_spec
    from batchspec.speculation.policy import KPolicy

    job = job_dict(tmp_path / "out", speculative={"k_grid": [0, 1, 3], "per_domain": per_domain})
    spec = load_spec(write_job(tmp_path / "job.yaml", job))
    policy = KPolicy(spec, OutDir(tmp_path / "out"), "w")
    for (domain, k), rate in rates.items():
        policy.ctl.add(
            Observation(
                domain,
                k,
                8,
                rows=100,
                output_tokens=10_000,
                running_s=10_000 / rate,
                accepted=3000 if k else 0,
                rejections=1000 if k else 0,
                spec_steps=3000 if k else 0,
                decode_steps=7000,
            )
        )
    return policy


def test_engines_are_planned_only_where_they_pay_for_their_start(tmp_path) -> None:
    # "a" is best at K=3, "b" at K=0; K=1 is nearly as good for both.
    policy = policy_with_rates(
        tmp_path,
        {
            ("a", 0): 10.0,
            ("a", 1): 13.0,
            ("a", 3): 14.0,
            ("b", 0): 14.0,
            ("b", 1): 13.0,
            ("b", 3): 10.0,
        },
    )
    rows = {"a": 800, "b": 800}  # 80,000 tokens each, on a batch of 8
    # Until an engine start is measured, every domain gets its own best K.
    assert policy.decide(rows, None).plan == {"a": 3, "b": 0}
    # Two engines save 2 x (10,000/13 - 10,000/14) = 110 s over K=1 for both: worth 60 s...
    policy.measured_start(60.0)
    assert policy.decide(rows, None).plan == {"a": 3, "b": 0}
    assert policy.decide(rows, 3).plan == {"a": 3, "b": 0}
    # ...but not 200 s: one engine, the K best for the two together, not either one's best.
    policy.measured_start(200.0)
    assert policy.decide(rows, None).plan == {"a": 1, "b": 1}
    # With an engine up at K=3, the second engine must save its start: 16 rows cannot.
    policy.measured_start(25.0)
    assert policy.decide({"a": 16, "b": 16}, 3).plan == {"a": 3, "b": 3}
    assert policy.decide({"a": 16, "b": 800}, 3).plan == {"a": 3, "b": 0}


def test_fixed_domains_keep_their_k_in_a_plan_and_share_its_engine(tmp_path) -> None:
    rates = {("a", 0): 10.0, ("a", 1): 14.0, ("a", 3): 12.0}
    policy = policy_with_rates(tmp_path, rates, f=0)
    policy.measured_start(1e6)
    # "f" needs a K=0 engine whatever the plan; "a" stays on the engine that is up.
    assert policy.decide({"a": 800, "f": 8}, 1).plan == {"a": 1, "f": 0}
    assert policy.decide({"a": 800, "f": 8}, 3).plan == {"a": 3, "f": 0}
    # A start of 1 s is worth it: "a" gets an engine at its own best K.
    policy.measured_start(1.0)
    assert policy.decide({"a": 800, "f": 8}, 0).plan == {"a": 1, "f": 0}


def test_a_never_measured_neighbour_k_is_probed_only_when_much_work_is_left(tmp_path) -> None:
    # Only K=0 and K=3 measured; the grid is [0, 1, 3]: K=1 is 3's unmeasured neighbour.
    policy = policy_with_rates(
        tmp_path, {("a", 0): 10.0, ("a", 3): 14.0, ("b", 0): 12.0, ("b", 3): 11.0}
    )
    many, few = {"a": 8000, "b": 80}, {"a": 16, "b": 16}
    assert policy.decide(many, None).probe is None  # no engine start measured yet
    policy.measured_start(25.0)
    # 8000 rows of "a" at 100 tokens, batch 8, 14 tok/s: ~7100 s left; two starts are 0.7 %.
    decision = policy.decide(many, None)
    assert decision.plan["a"] == 3 and decision.probe == ("a", 1)
    # 16 rows: ~14 s left, far less than the two starts are worth at explore = 0.05.
    assert policy.decide(few, 3).probe is None
    policy.ctl.add(Observation("b", 1, 8, rows=10, output_tokens=1000, running_s=80.0))
    assert policy.decide(many, 3).probe is None  # K=1 is measured now


def test_units_ride_along_at_a_neighbouring_k_up_to_the_explore_share(tmp_path) -> None:
    """Only where drafts cannot be replayed: n-gram acceptance comes from replay, so no unit
    of an n-gram job ever runs away from its planned K."""
    policy = policy_with_rates(tmp_path, {("a", 0): 10.0, ("a", 1): 14.0})
    assert policy.replays and not any(policy.explores("a", 1, 0) for _ in range(100))
    policy.replays = False  # as for drafts that need a model
    assert not policy.explores("a", 3, 0)  # not a grid neighbour of K=3
    rode = 0
    for _ in range(100):
        ride = policy.explores("a", 1, 0)
        rode += ride
        policy.taken("a", explored=ride)
    assert rode == 5  # explore = 0.05 of the units


# -- replayed acceptance and profiled step cost --------------------------------------------


def replayed_observation(domain: str, k: int, per_k: dict[int, int], rows: int = 10) -> Observation:
    """``rows`` rows of 101 tokens that ran at K, replayed at every K of ``per_k`` (accepted
    drafts of each row's 100 decode tokens)."""
    ob = Observation(domain, k, 8, rows=rows, output_tokens=101 * rows, running_s=10.0 * rows)
    ob.add_replay([[kk, 100 * rows, a * rows] for kk, a in per_k.items()])
    return ob


def test_replay_and_a_profile_price_every_k_without_running_it() -> None:
    """Two domains ran only at K=3. Replay says "easy" accepts 60 of 100 decode tokens at
    K=3 (tokens per step 2.5) and "hard" 5 (1.05); the profile says a step at K costs
    1 + 0.1 K. Easy: K=3 gives 2.5/1.3 = 1.92 per unit time against K=0's 1 and K=1's
    (100/60)/1.1 = 1.52: K=3. Hard: K=0 (1.0) beats K=1 (1.04/1.1) and K=3 (1.05/1.3),
    though K=0 never ran: plain decoding is always a candidate."""
    ctl = Controller(8, [0, 1, 3], 3, step_cost=lambda k: 1.0 + 0.1 * k)
    ctl.add(replayed_observation("easy", 3, {0: 0, 1: 40, 3: 60}))
    ctl.add(replayed_observation("hard", 3, {0: 0, 1: 4, 3: 5}))
    easy, hard = ctl.choose("easy"), ctl.choose("hard")
    assert easy.k == 3 and hard.k == 0
    assert easy.replayed == pytest.approx({0: 1.0, 1: 100 / 60, 3: 2.5})
    assert easy.measured == [3] and hard.measured == [3]
    # Rates: tokens per step over the profiled step, scaled to the measured rate at K=3.
    assert hard.rates[0] / hard.rates[3] == pytest.approx(1.3 / (100 / 95))
    # Without a profile, the unmeasured K have no step time: only K=3 is known.
    plain = Controller(8, [0, 1, 3], 3)
    plain.add(replayed_observation("hard", 3, {0: 0, 1: 4, 3: 5}))
    assert plain.choose("hard").k == 3 and set(plain.choose("hard").rates) == {3}


def test_replay_from_another_batch_size_still_tells_acceptance() -> None:
    ctl = Controller(8, [0, 1, 3], 3, step_cost=lambda k: 1.0 + 0.1 * k)
    ob = replayed_observation("hard", 3, {0: 0, 1: 4, 3: 5})
    ob.batch = 1
    ctl.add(ob)
    assert ctl.replayed("hard")[3] == pytest.approx(100 / 95)
    assert ctl.measured_k("hard") == []


def test_an_engine_that_takes_k_per_unit_gets_every_domain_at_its_best_k(tmp_path) -> None:
    """A tree engine with a profile: no engine plan, no probe; the scheduler hands out units
    in plan order, whatever their domain, each with its domain's K, and none explores."""
    from batchspec.units import WorkUnit
    from batchspec.work.scheduler import Scheduler

    policy = policy_with_rates(tmp_path, {})
    profile = type("Profile", (), {"seconds": lambda self, b, k: 1 + 0.1 * k})()
    policy.engine_up(type("Tree", (), {"k_per_unit": True, "step_profile": profile})())
    policy.ctl.add(replayed_observation("easy", 3, {0: 0, 1: 40, 3: 60}))
    policy.ctl.add(replayed_observation("hard", 3, {0: 0, 1: 4, 3: 5}))
    policy.measured_start(1.0)
    decision = policy.decide({"easy": 100_000, "hard": 100_000}, 3)
    assert decision.plan == {"easy": 3, "hard": 0} and decision.probe is None
    units = [WorkUnit(0, "x", i, i + 1, d, 1) for i, d in enumerate(["hard", "easy", "hard"])]
    sched = Scheduler(units, policy)
    k, first = sched.next_engine(3)
    assert (k, first) == (3, units[0]) and sched.unit_k(first) == 0
    taken = [sched.next_unit(3), sched.next_unit(3)]
    assert taken == units[1:] and [sched.unit_k(u) for u in taken] == [3, 0]
    assert sched.next_unit(3) is None and policy.explored == 0
    # Its batches hold rows at several K: what it commits says so (``Observation.mixed``).
    committed = replayed_observation("easy", 3, {0: 0, 3: 60})
    policy.observe(committed)
    assert committed.mixed


def test_the_first_unit_is_given_its_k_again_once_the_engine_prices_steps(tmp_path) -> None:
    """The run's first unit is taken before any engine is up: nothing prices a step, so its
    blind K is the spec's (3). Once an engine that takes K per unit is up with a profile in
    which a step at K=3 costs 1.3 plain ones, the unit is given its K again: plain, as blind
    units are at that price; "easy" (replayed) keeps its own K=3. A job with speculation
    fixed, or a unit given a K once the engine was up, is left alone."""
    from batchspec.units import WorkUnit
    from batchspec.work.scheduler import Scheduler

    policy = policy_with_rates(tmp_path, {})
    policy.ctl.add(replayed_observation("easy", 3, {0: 0, 1: 40, 3: 60}))
    units = [WorkUnit(0, "x", i, i + 1, d, 1) for i, d in enumerate(["new", "easy", "new"])]
    sched = Scheduler(units, policy)
    k, first = sched.next_engine(None)
    assert (k, first) == (3, units[0])
    profile = type("Profile", (), {"seconds": lambda self, b, k: 1 + 0.1 * k})()
    policy.engine_up(type("Tree", (), {"k_per_unit": True, "step_profile": profile})())
    sched.rechoose(first)
    assert sched.unit_k(first) == 0
    taken = sched.next_unit(3)
    sched.rechoose(taken)  # given its K when taken: kept
    assert sched.unit_k(taken) == 3
    policy.adaptive = False
    sched.rechoose(first)
    assert sched.unit_k(first) is None


def test_a_domain_nothing_was_learnt_of_starts_at_the_largest_k_that_cannot_lose_much() -> None:
    """Before any replay a domain without counts starts blind: not at what a prior acceptance
    would pick, but at the largest K up to the spec's (3) whose step costs at most
    ``BLIND_LOSS`` (2 %) more than a plain one, what it loses should nothing be accepted. One
    replayed unit moves it to its own best K."""
    assert BLIND_LOSS == 0.02
    ctl = Controller(8, [0, 1, 3, 8], 3, step_cost=lambda k: 1.0 + 0.01 * k)
    assert ctl.choose("new").k == 1  # K=3 costs 3 % more, K=8 is past the spec's K
    ctl.add(replayed_observation("other", 3, {0: 0, 1: 50, 3: 80, 8: 95}))
    assert ctl.choose("other").k == 8
    # Costs as a GPU's at batch 1 (a few nodes' verify is a plain step): the spec's K.
    assert Controller(1, [0, 1, 3, 8], 3, step_cost=lambda k: 1.0 + 0.005 * k).choose(None).k == 3
    # Nothing prices a step: the spec's K; every K costs too much: K=0.
    assert Controller(8, [0, 1, 3, 8], 3).choose(None).k == 3
    assert Controller(8, [0, 1, 3], 3, step_cost=lambda k: 1.0 + 0.5 * k).choose(None).k == 0
    # Costs rise with K: a cheap K past a dear one is a profile's quirk, not a bound.
    quirk = {0: 1.0, 1: 1.05, 3: 1.01}
    assert blind_k([0, 1, 3], 3, quirk.__getitem__) == 0
    # Without K=0 in the grid, the smallest K where none is within the bound; unpriced: stop.
    assert blind_k([2, 4], 4, lambda k: 1.0 + 0.5 * k) == 2
    assert blind_k([0, 1, 3], 3, {0: 1.0, 1: 1.0, 3: float("nan")}.__getitem__) == 1


def test_a_domain_not_seen_yet_starts_blind_whatever_other_domains_replay() -> None:
    """Other domains' replay is no prior for a domain not seen yet: "easy" accepts 90 of 100
    decode tokens at K=3, "hard" none, and the next domain may be either. With a step at K=3
    costing 1.5x a plain one, pooled replay (200 / 110 = 1.82 a step: 1.21 > 1) would start
    it at K=3, a third slower than plain were it "hard"; it starts blind instead: at the
    largest K whose step costs at most ``BLIND_LOSS`` more than a plain one, K=0 here, and
    K=3 where a step at K=3 costs 1 % more. "easy" itself runs K=3 at both prices."""
    for cost, want in ((lambda k: 1.0 + k / 6, 0), (lambda k: 1.0 + k / 300, 3)):
        ctl = Controller(8, [0, 3], 8, step_cost=cost)
        ctl.add(replayed_observation("easy", 3, {0: 0, 3: 90}))
        ctl.add(replayed_observation("hard", 3, {0: 0, 3: 0}))
        assert ctl.choose("new").k == want and ctl.choose("easy").k == 3
        assert ctl.table(["new"])[1].tolist() == [want]


def only_sparse_speculates(ctl: Controller) -> None:
    """ "sparse" and "dense" replay 1.4 tokens a step at K=2; priced at their own drafts, a K=2
    step costs 1.3 plain steps for sparse and 1.9 for dense."""
    sparse, dense = ctl.choose("sparse"), ctl.choose("dense")
    assert (sparse.k, dense.k) == (2, 0)
    assert sparse.rates[2] / sparse.rates[0] == pytest.approx(1.4 / 1.3)
    assert dense.rates[2] / dense.rates[0] == pytest.approx(1.4 / 1.9)


def test_vllm_prices_each_domains_k_at_its_own_drafts() -> None:
    """vLLM's n-gram chains draft K tokens or none, so a domain's rows draft coverage·K per
    step. "sparse" drafted at 30 % of its steps, "dense" at 90 %, and their replays agree (1.4
    tokens per step at K=2, 1.6 at K=4). With a drafted token at half a row's step,
    sparse's K=2 step costs 1.3 (1.4/1.3 > K=0's 1/1), dense's 1.9 (1.4/1.9 < 1): only
    sparse speculates. Priced at the pooled share of filled slots (60 %: 1.6 at K=2), neither
    would."""

    def ran(domain: str, coverage: float) -> Observation:
        ob = replayed_observation(domain, 2, {0: 0, 2: 100 * 0.4 / 1.4, 4: 100 * 0.6 / 1.6})
        ob.decode_steps, ob.spec_steps = 1000, int(1000 * coverage)
        ob.accepted, ob.rejections = 300, int(1000 * coverage) - 100
        return ob

    def controller(own_drafts: bool) -> Controller:
        ctl = Controller(8, [0, 2, 4], 2, step_cost=lambda k: 1.0 + 0.5 * 0.6 * k)
        if own_drafts:
            ctl.fill_cost = lambda k, fill: 1.0 + 0.5 * fill * k
        ctl.add(ran("sparse", 0.3))
        ctl.add(ran("dense", 0.9))
        return ctl

    ctl = controller(own_drafts=True)
    only_sparse_speculates(ctl)
    pooled = controller(own_drafts=False)
    assert (pooled.choose("sparse").k, pooled.choose("dense").k) == (0, 0)
    # A domain not seen yet keeps the pooled price.
    assert pooled.table([None])[0][0].tolist() == ctl.table([None])[0][0].tolist()


def test_a_domain_that_never_drafted_is_priced_at_its_replayed_drafts() -> None:
    """Both domains ran at K=0 only, so no engine counted their drafts; replay proposes
    vLLM's chains at every K and counts them. Same replayed acceptance (1.4 tokens per step at
    K=2, 1.6 at K=4), but "sparse"'s drafts fill 30 % of the K slots a step, "dense"'s 90 %:
    with a drafted token at half a row's step, sparse's K=2 step costs 1.3 (1.4/1.3 > 1),
    dense's 1.9: only sparse speculates. Without the counts (replays of older runs) both
    keep the pooled price (60 %: 1.6 at K=2) and neither does. A domain not seen yet is
    priced at every domain's replayed drafts pooled (60 %)."""

    def ran(domain: str, fill: float, counted: bool) -> Observation:
        ob = Observation(domain, 0, 8, rows=10, output_tokens=1010, running_s=100.0)
        for k, per_step in ((0, 1.0), (2, 1.4), (4, 1.6)):
            steps = 1000 / per_step
            drafted = [fill * k * steps] if counted else []
            ob.add_replay([[k, 1000, 1000 - steps, *drafted]])
        return ob

    def controller(counted: bool) -> Controller:
        ctl = Controller(8, [0, 2, 4], 2, step_cost=lambda k: 1.0 + 0.5 * 0.8 * k)
        ctl.fill_cost = lambda k, fill: 1.0 + 0.5 * fill * k
        ctl.add(ran("sparse", 0.3, counted))
        ctl.add(ran("dense", 0.9, counted))
        return ctl

    ctl = controller(counted=True)
    only_sparse_speculates(ctl)
    assert ctl.choose("new").rates[2] == pytest.approx(1.4 / 1.6)
    older = controller(counted=False)
    assert (older.choose("sparse").k, older.choose("dense").k) == (0, 0)
    assert older.choose("sparse").rates[2] == pytest.approx(1.4 / 1.8)


def test_replay_counts_the_drafts_vllm_would_propose() -> None:
    """Observation sums keep the drafted count only while every row they add has one."""
    ob = Observation("d", 0, 8)
    ob.add_replay([[2, 100, 30, 80]])
    ob.add_replay([[2, 50, 10, 40]])
    assert ob.replay == [[2, 150, 40, 120]]
    ob.add_replay([[2, 10, 0]])
    assert ob.replay == [[2, 160, 40]]


def test_rows_sharing_batches_at_several_k_set_only_their_domains_level() -> None:
    """An engine that takes K per unit, at batch 8: a domain's K=0 rows ran beside other
    domains' K=3 rows and its K=3 rows beside K=0 rows, so their measured rates (9 and 11
    tok/s, 20 rows each, little spread) are their neighbours' pace as much as their own K's.
    Replay gives 1.2 tokens a step at K=3 and the step model 1.5x a plain step: K=0 pays
    (1 against 0.8). Measured rates taken per K would say K=3 (11 > 9, beyond their noise);
    marked ``mixed`` they set the domain's level (their sum over the model's: 20 / 1.8) and
    the model compares K. Without a step model they are all there is."""

    def ran(k: int, rate: float, mixed: bool) -> Observation:
        ob = Observation("a", k, 8, rows=20, output_tokens=2000, running_s=2000 / rate)
        ob.rated, ob.rate_sum, ob.rate_sq = 20, 20 * rate, 20 * rate**2 * 1.0001
        ob.add_replay([[0, 1980, 0], [3, 1980, 1980 - 1980 / 1.2]])
        ob.mixed = mixed
        return ob

    for mixed, want in ((False, 3), (True, 0)):
        ctl = Controller(8, [0, 3], 3, step_cost=lambda k: 1.0 + k / 6)
        ctl.add(ran(0, 9.0, mixed))
        ctl.add(ran(3, 11.0, mixed))
        assert ctl.choose("a").k == want, mixed
    assert ctl.choose("a").rates == pytest.approx({0: 20 / 1.8, 3: 0.8 * 20 / 1.8})
    blind = Controller(8, [0, 3], 3)
    blind.add(ran(0, 9.0, True))
    blind.add(ran(3, 11.0, True))
    assert blind.choose("a").rates == pytest.approx({0: 9.0, 3: 11.0})
