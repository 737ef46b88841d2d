"""``report``'s drafter view (``observe/drafter_view.py``) from an output directory alone: the
stats a run with ``speculative.drafters`` shares and the step costs it priced with; and the
``batchspec report`` command printing it. No engine: made-up measurements."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from conftest import run_cli

from batchspec.io.layout import OutDir
from batchspec.observe.drafter_view import drafter_view, format_drafter_view
from batchspec.speculation.estimator import Observation
from batchspec.speculation.steps import write_step_costs


def replays(tokens: int, **accepted: tuple[int, int]) -> dict[str, list[list[int]]]:
    return {
        d: [[0, tokens, 0], [2, tokens, a2], [4, tokens, a4]] for d, (a2, a4) in accepted.items()
    }


def made_run(tmp_path: Path) -> OutDir:
    """Two domains' units, both drafters replayed on them; steps priced as a worker would
    (its seconds hold the method's drafting: n-gram's 10 us a row)."""
    out = OutDir(tmp_path / "out")
    units = [
        Observation("json", 4, 8, rows=8, output_tokens=1000, drafter="ngram", engine="tree",
                    replays=replays(1000, ngram=(200, 250), suffix=(400, 500))),
        Observation("chat", 4, 8, rows=8, output_tokens=1000, drafter="ngram", engine="tree",
                    replays=replays(1000, ngram=(10, 12), suffix=(15, 18))),
    ]  # fmt: skip
    out.stats.mkdir(parents=True)
    lines = [json.dumps(asdict(u)) for u in units]
    (out.stats / "w1.jsonl").write_text("\n".join(lines) + "\n")
    seconds = {k: 0.010 + 0.002 * k + (8e-5 if k else 0.0) for k in (0, 2, 4)}
    write_step_costs(out, "w1", "tree", 8, seconds, drafting={"ngram": 1e-5, "suffix": 3e-5})
    return out


def test_each_domains_drafter_and_the_alternatives_predicted_rates(tmp_path: Path) -> None:
    out = made_run(tmp_path)
    view = drafter_view(out)
    assert view is not None
    batch, picks = view
    assert batch == 8
    assert (picks["json"].drafter, picks["json"].k) == ("suffix", 2)
    assert (picks["chat"].drafter, picks["chat"].k) == ("ngram", 0)
    text = format_drafter_view(view)
    lines = text.splitlines()
    assert lines[1].split() == ["domain", "drafter", "K", "tok/s", "K=0", "ngram", "suffix"]
    # json: suffix at K=2, 8 rows x 1000/600 tokens a step / (14 ms + 8 x 30 us) = 936.3 tok/s;
    # plain 800.0; n-gram at its best, K=2, 8 x 1.25 / 14.08 ms = 710.2.
    assert lines[3].split() == [
        "json",
        "suffix",
        "2",
        "936.3",
        "800.0",
        "K=2",
        "710.2",
        "K=2",
        "936.3",
    ]
    assert lines[2].split()[:5] == ["chat", "ngram", "0", "800.0", "800.0"]


def test_report_prints_it_and_a_single_drafter_run_does_not(tmp_path: Path) -> None:
    out = made_run(tmp_path)
    fields = {"spec_hash": "h", "input_fingerprint": "f", "limit": None, "num_units": 2}
    fields |= {"num_rows": 16, "created": 0.0, "version": "test"}
    (out.root / "manifest.json").write_text(json.dumps(fields))  # an output directory
    shown = run_cli("report", str(out.root))
    assert "drafter per domain at batch 8" in shown.stdout, shown.stdout + shown.stderr[-2000:]
    single = Observation("a", 4, 8, rows=1, output_tokens=10, engine="tree", replay=[[4, 9, 1]])
    (out.stats / "w1.jsonl").write_text(json.dumps(asdict(single)) + "\n")
    assert drafter_view(out) is None
