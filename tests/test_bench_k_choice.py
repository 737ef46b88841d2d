"""The K-choice benchmark's table and verdict line, from saved measurements (no engine).

``scripts/bench/k_choice.py --table FILE`` prints the table of a saved run; the test runs it
as a user does, on measurements made up so that every figure is known: ratios of means with
their per-round range, the best fixed K picked per batch size, the count of units run off
their domain's main K (or the run log's own count), and the last line for the last batch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "scripts" / "bench" / "k_choice.py"


def run(
    tok_s: float, k_units: dict[str, dict[str, int]], explored: int | None = None, tpf=None
) -> dict:
    # tpf: tokens per target forward; None: a run saved before the benchmark recorded it.
    return {
        "tok_s": tok_s,
        "tokens": 1000,
        "generate_s": 1000 / tok_s,
        "engine_builds": 1,
        "units_explored": explored,
        "replay_s": 0.5,
        "replay_checked": 10,
        "replay_equal": 10,
        "domain_rates": {"chat": 10.0, "long_qa": 20.0},
        "k_units": k_units,
    } | ({} if tpf is None else {"tokens_per_forward": tpf})


def batch(rates: dict[str, list[float]], adaptive_units, explored=(None, None), tpf=()) -> dict:
    plain = {"chat": {"0": 2}, "long_qa": {"0": 2}}
    runs = {c: [run(x, plain) for x in xs] for c, xs in rates.items() if c != "adaptive"}
    tpf = tpf or [None] * len(explored)
    runs["adaptive"] = [
        run(x, adaptive_units, e, t)
        for x, e, t in zip(rates["adaptive"], explored, tpf, strict=True)
    ]
    return {
        "configs": list(rates),
        "runs": runs,
        "oracle_k": [{"chat": 0, "long_qa": 4}, {"chat": 0, "long_qa": 4}],
    }


def test_table_and_verdict_from_saved_measurements(tmp_path: Path) -> None:
    saved = {
        "setting": "made-up measurements",
        "batches": {
            "1": batch(
                {
                    "K=0": [20.0, 22.0],
                    "K=4": [30.0, 26.0],
                    "adaptive": [29.0, 27.0],
                    "oracle": [31.0, 29.0],
                },
                {"chat": {"0": 3, "4": 1}, "long_qa": {"4": 2, "2": 1}},
                tpf=(1.5, 1.3),
            ),
            "8": batch(
                {
                    "K=0": [50.0, 46.0],
                    "K=4": [44.0, 40.0],
                    "adaptive": [47.0, 49.0],
                    "oracle": [52.0, 48.0],
                },
                {"chat": {"0": 4}, "long_qa": {"4": 4}},
                explored=(0, 1),
            ),
        },
    }
    # A run stopped in its second round at batch 16 (its first round counts) and one stopped
    # in its first round at batch 32 (no table): the verdict is batch 16's.
    saved["batches"]["16"] = batch(
        {"K=0": [60.0, 58.0], "K=4": [50.0], "adaptive": [55.0], "oracle": [57.0]},
        {},
        (None,),
    )
    saved["batches"]["32"] = batch({"K=0": [60.0], "K=4": [], "adaptive": [], "oracle": []}, {}, ())
    path = tmp_path / "k_choice.json"
    path.write_text(json.dumps(saved))
    done = subprocess.run(
        [sys.executable, str(BENCH), "--table", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    # batch 16, round 1 alone: best fixed K=0 (60.0); adaptive 55.0 -> 0.917, oracle 57 -> 0.965.
    assert lines[-1] == (
        "adaptive / best fixed K: 0.917 (batch 16), adaptive / per-domain oracle: 0.965"
    )
    out = done.stdout
    assert "batch 32: no complete round" in out
    assert "| K=0 | 60.0 | 60.0 ± 0.0 |" in out
    assert "batch 1: generation tok/s per round (ABBA), best fixed K here: K=4" in out
    # batch 1, adaptive: mean 28.0 ± 1.0; / K=0 28/21 = 1.333, rounds 1.450 and 1.227;
    # / K=4 (28.0) 1.000, rounds 0.967 and 1.038; 1.4 tokens per forward (mean of 1.5 and
    # 1.3), efficiency 1.333 / 1.4 = 0.95; 2 units off their domain's main K.
    assert (
        "| adaptive | 29.0 | 27.0 | 28.0 ± 1.0 | 1.333 [1.227-1.450] | 1.000 [0.967-1.038] "
        "| 1.40 | 0.95 | 2/2 (off main K) |" in out
    )
    # batch 8: the run log's own count wins over the proxy; runs saved without tokens per
    # forward show none.
    assert "| adaptive | 47.0 | 49.0 | 48.0 ± 1.0 | 1.000 [0.940-1.065] |" in out
    assert "| - | - | 0/1 (run log) |" in out
    assert "oracle K per round: chat=0 long_qa=4; chat=0 long_qa=4" in out
    # batch 8: 8 runs of 10 rows checked; adaptive 0.5 s of 1000/47 and 1000/49 s.
    assert "on 80/80 rows checked (all runs); replay time in adaptive runs: 2.35%/2.45%" in out
    assert (
        "adaptive / best fixed K=0: 1.000 [0.940-1.065] (target >= 1.00), "
        "adaptive / oracle: 0.960 [0.904-1.021] (target >= 0.97)" in out
    )
