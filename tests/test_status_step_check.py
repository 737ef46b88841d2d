"""``status`` shows the tree engine's step-profile check (``engines.tree.step_check``) as
``report`` does: in ``--json`` as ``step_check`` (null without one), and as one line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from test_observe_units import leased_run

from batchspec.cli import main
from batchspec.engines.tree.step_check import MIN_STEPS, StepCheck
from batchspec.speculation.steps import write_step_costs


def test_status_shows_the_step_checks_cells(tmp_path: Path) -> None:
    out, _ = leased_run(tmp_path)
    plain = json.loads(CliRunner().invoke(main, ["status", str(out), "--json"]).stdout)
    assert plain["step_check"] is None  # no tree engine priced K here
    check = StepCheck()
    for _ in range(MIN_STEPS):
        check.add((8, 0), 0.020, 0.020)
        check.add((8, 6), 0.060, 0.030)  # twice its profile
    assert check.scale == 1.5 and check.replaced == {(8, 0), (8, 6)}  # both off x1.5
    fit = {"kind": "tree-profile", **check.summary({(8, 0): 0.02, (8, 6): 0.03}), "priced": {}}
    write_step_costs(out, "w1", "tree", 8, {0: 0.02, 6: 0.06}, fit)
    st = json.loads(CliRunner().invoke(main, ["status", str(out), "--json"]).stdout)
    got = st["step_check"]
    assert (got["batch"], got["steps"], got["scale"]) == (8, 2 * MIN_STEPS, check.scale)
    assert [(c["batch"], c["nodes"], c["replaced"]) for c in got["cells"]] == [
        (8, 0, True),
        (8, 6, True),
    ]
    lines = CliRunner().invoke(main, ["status", str(out)]).stdout.splitlines()
    (line,) = [x for x in lines if x.startswith("step profile")]
    assert line.startswith(f"step profile (tree, batch 8): {2 * MIN_STEPS} steps, measured / ")
    assert "profiled 1.50, profile scaled x1.50" in line
    assert line.endswith("8x0 20.0/20.0*, 8x6 60.0/30.0*"), line
