"""What ``report`` and ``status`` show of the K controller (issue 22): per domain the K
chosen, its predicted tokens/s, the replayed tokens per step at every K of the grid and which
K were measured, priced as the run priced them (``speculation/steps.py``). No engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchspec.io.layout import OutDir
from batchspec.observe.report import controller_view, format_k_view
from batchspec.observe.status_view import _domains, _k_text
from batchspec.speculation.estimator import Observation
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.steps import read_step_costs, write_step_costs
from batchspec.work.progress import RunTotals


def unit(domain: str, k: int, per_k: dict[int, int]) -> Observation:
    """A unit of 20 rows of 101 tokens at K on the tree engine (10.1 tok/s a row), replayed
    at every K of ``per_k`` (accepted drafts per row's 100 decode tokens)."""
    ob = Observation(domain, k, 8, rows=20, output_tokens=2020, running_s=200.0, engine="tree")
    ob.rated, ob.rate_sum, ob.rate_sq = 20, 202.0, 20 * 10.1**2 + 0.5
    ob.add_replay([[kk, 2000, 20 * a] for kk, a in per_k.items()])
    return ob


@pytest.fixture
def out(tmp_path: Path) -> OutDir:
    """A run's stats: "easy" and "hard" ran at K=3 only; the worker priced K by a profile
    in which a step costs 1 + 0.1 K seconds."""
    out = OutDir(tmp_path / "out")
    shared = SharedStats(out, "w1")
    shared.append(unit("easy", 3, {0: 0, 1: 40, 3: 60}))
    shared.append(unit("hard", 3, {0: 0, 1: 4, 3: 5}))
    write_step_costs(out, "w1", "tree", 8, {k: 1 + 0.1 * k for k in (0, 1, 3)})
    return out


def test_the_step_costs_a_run_priced_k_by_are_read_back(out: OutDir) -> None:
    cost = read_step_costs(out, "tree", 8)
    assert cost is not None and cost(1) == pytest.approx(1.1) and cost(2) == pytest.approx(1.2)
    assert read_step_costs(out, "vllm", 8) is None and read_step_costs(out, "tree", 1) is None


def test_report_shows_each_domains_k_and_its_replayed_acceptance(out: OutDir) -> None:
    """Hard's replay says K=0 is faster (1.0 per second against 1.05/1.3) though K=0 never
    ran: the view chooses it, marks K=3 as the one measured, and the text table shows the
    replayed tokens per step at every K."""
    view = controller_view(out)
    assert view is not None
    batch, per_domain = view
    easy, hard = per_domain["easy"], per_domain["hard"]
    assert batch == 8 and easy.k == 3 and hard.k == 0
    assert hard.measured == [3] and hard.priced == [0, 1, 3]
    assert hard.replayed == pytest.approx({0: 1.0, 1: 100 / 96, 3: 100 / 95})
    # The measured rate at K=3 is 10.1 tok/s a row; K=0 is priced relative to it.
    assert hard.tokens_per_s == pytest.approx(8 * 10.1 * 1.3 / (100 / 95))
    text = format_k_view(view).splitlines()
    assert text[1].split() == ["domain", "chosen_K", "tok/s", "K=0", "K=1", "K=3"]
    assert text[3].split()[:2] == ["hard", "0"] and text[3].split()[3:] == ["1.00", "1.04", "1.05*"]
    assert format_k_view(view, markdown=True).startswith("| domain | chosen_K |")


def test_a_k_that_ran_has_its_column_where_replay_did_not_reach_it(out: OutDir) -> None:
    # Replay works within a time budget: under load a unit's rows may be replayed at the
    # small K only. The K they ran at still shows, marked measured (seen in CI: K=8 missing).
    SharedStats(out, "w1").append(unit("odd", 5, {0: 0, 1: 30}))
    text = format_k_view(controller_view(out)).splitlines()
    assert text[1].split() == ["domain", "chosen_K", "tok/s", "K=0", "K=1", "K=3", "K=5"]
    odd = next(line.split() for line in text if line.startswith("odd"))
    assert odd[-1] == "-*" and odd[-2] == "-"


def test_status_shows_the_same_per_domain(out: OutDir) -> None:
    view = controller_view(out)
    totals = RunTotals(40)
    for d in ("easy", "hard"):
        totals.domains[d] = {
            "rows": 20, "errors": 0, "output_tokens": 2020, "accepted": 0, "drafted": 0,
            "steps": 0, "k_in_use": [], "k_last": 3,
        }  # fmt: skip
    rows = {r["domain"]: r for r in _domains(totals, view)}
    assert rows["hard"]["k_chosen"] == 0 and rows["hard"]["k_measured"] == [3]
    assert rows["hard"]["replayed_tokens_per_step"]["3"] == pytest.approx(100 / 95)
    assert rows["easy"]["predicted_tokens_per_s"] == pytest.approx(8 * 10.1)
    assert "chosen K 0" in _k_text(rows["hard"]) and "3:1.05*" in _k_text(rows["hard"])
    # Without a view (nothing committed yet) the fields are there, empty.
    assert _domains(totals)[0]["k_chosen"] is None


def test_report_says_when_acceptance_is_the_geometric_models(tmp_path: Path) -> None:
    """A method whose drafts are not replayed (draft model, EAGLE, suffix, MTP on vLLM):
    the report says that its K rests on the geometric model, not on replay."""
    out = OutDir(tmp_path / "out")
    ob = Observation("d", 3, 8, rows=4, output_tokens=400, running_s=40.0, engine="vllm")
    ob.accepted, ob.rejections, ob.spec_steps, ob.decode_steps = 30, 90, 100, 366
    SharedStats(out, "w1").append(ob)
    view = controller_view(out)
    assert view is not None and view[1]["d"].replayed == {}
    assert format_k_view(view) == (
        "K per domain at batch 8: no row replayed (replay is exact for n-gram drafts only); "
        "acceptance at every K from the geometric model, alpha from the engine's own counts"
    )
