"""Shared test helpers: job specs on the project's prompt set, and the CLI as a subprocess.

End-to-end tests run the real ``batchspec`` command (real vLLM on the embedded model) in a
subprocess, exactly as a user would; only unit tests of orchestration logic use doubles.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_fixture import slurm_cluster  # noqa: F401  (a real one-node Slurm cluster)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "jobs" / "data" / "prompts.parquet"
SPECULATIVE_MEASURED = (
    "num_spec_steps",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "acceptance_histogram",
)
"""The issue's columns measured by speculation: null, not zero, on rows generated without it."""


def job_dict(out_dir: Path, **sections: dict[str, Any] | None) -> dict[str, Any]:
    """The shipped default job, made small and fast; sections override key by key."""
    job: dict[str, Any] = yaml.safe_load((ROOT / "jobs" / "synth_data.yaml").read_text())
    job["input"]["path"] = str(PROMPTS)
    job["output"] = {"dir": str(out_dir), "unit_rows": 8}
    job["model"].update(max_model_len=1024, max_num_seqs=8)
    job["sampling"]["max_tokens"] = 32
    for name, values in sections.items():
        if values is None:
            job.pop(name, None)
        else:
            job.setdefault(name, {}).update(values)
    return job


def write_job(path: Path, job: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``batchspec ARGS`` in a fresh interpreter, output captured."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [sys.executable, "-m", "batchspec", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def job_file(tmp_path: Path):
    """Factory: write a job (with overrides) into tmp_path and return its path."""

    def make(name: str = "job.yaml", **sections: dict[str, Any]) -> Path:
        return write_job(tmp_path / name, job_dict(tmp_path / "out", **sections))

    return make
