"""Launching logic without an engine: GPU slices, the sbatch script, status from a directory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.cluster.launch import cpu_slices, gpu_slices
from batchspec.cluster.slurm import SubmitOptions, render_script
from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.observe.status import run_status
from batchspec.observe.status_view import format_status
from batchspec.work.leases import Leases


def test_gpu_slices_by_tensor_parallel_size() -> None:
    assert gpu_slices(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert gpu_slices(3, 1, ["4", "5", "6"]) == ["4", "5", "6"]
    assert gpu_slices(2, 4, []) == [None, None]  # CPU: workers share the machine
    with pytest.raises(UserError, match="needs 8 GPUs; 4 are visible"):
        gpu_slices(2, 4, ["0", "1", "2", "3"])


def test_cpu_slices_give_each_worker_its_own_cores() -> None:
    assert cpu_slices(2, 1, [0, 1]) == ["0", "1"]
    # Four cores per worker, all for its threads: a one-rank model computes in its engine core.
    assert cpu_slices(2, 1, list(range(8))) == ["0,1,2,3", "4,5,6,7"]
    # One bind list per tensor-parallel rank, each rank's last core left to the engine core.
    assert cpu_slices(1, 2, [0, 1, 2, 3]) == ["0|2"]
    assert cpu_slices(3, 1, [0, 1]) == [None, None, None]  # fewer cores than workers


def test_sbatch_script(tmp_path: Path) -> None:
    opts = SubmitOptions(
        tasks=4,
        gpus_per_task=8,
        partition="h100",
        time="24:00:00",
        account="proj",
        job_name="synth",
        signal_lead_s=300,
        extra=["--exclusive"],
    )
    out = OutDir(tmp_path)
    script = render_script(Path("/jobs/j.yaml"), out, ["--set=sampling.seed=1"], opts, 1)
    for line in [
        "#SBATCH --array=0-3",
        f"#SBATCH --output={tmp_path}/slurm/%A_%a.log",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@300",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --partition=h100",
        "#SBATCH --time=24:00:00",
        "#SBATCH --account=proj",
        "#SBATCH --exclusive",
        "#SBATCH --job-name=synth",
    ]:
        assert line in script.splitlines(), line
    assert f"run /jobs/j.yaml --output {tmp_path} --set=sampling.seed=1 &" in script
    assert "--workers" not in script
    two = render_script(Path("/j.yaml"), out, [], SubmitOptions(gpus_per_task=8), 2)
    assert "--workers 2" in two and "trap" in two and "wait $worker" in two


def test_status_counts_units_by_state(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "spec_hash": "h",
                "input_fingerprint": "f",
                "limit": None,
                "num_units": 5,
                "num_rows": 50,
                "created": time.time(),
                "version": "0",
            }
        )
    )
    (tmp_path / "parts").mkdir()
    for uid in ("u1", "u2"):
        pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "parts" / f"{uid}.parquet")
    live = Leases(OutDir(tmp_path), "w1", 60, 1, progress=lambda: {"u3": 4})
    live.try_claim("u3")
    live.beat()
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "u4.json").write_text("{}")
    st = run_status(OutDir(tmp_path))
    assert (st.units_done, st.units_leased, st.units_failed, st.units_pending) == (2, 1, 1, 1)
    assert st.rows_done == 20 and not st.complete
    assert st.leases[0]["worker"] == "w1" and st.leases[0]["rows_finished"] == 4
    text = format_status(st)
    assert "units: 2/5 done, 1 leased, 1 pending, 1 failed" in text
    assert "rows: 20/50 committed (40.0%)" in text


def test_status_without_a_run(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no batchspec run here"):
        run_status(OutDir(tmp_path))
