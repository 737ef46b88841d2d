"""Tuning files written by hand, as ``batchspec tune`` would write them, so that tests of what
reads them (the K policy, a run) need no ``tune`` run: vLLM, n-gram, K 0 and 3, batch 8."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from batchspec.spec.file import load_spec
from batchspec.speculation.estimator import Observation
from batchspec.speculation.tuning import (
    BatchTuning,
    EngineTuning,
    TuningFile,
    read_tuning,
    tuning_identity,
    write_tuning,
)


def write_ngram_tuning(path: Path, job: Path, observations: list[Observation]) -> None:
    """A tuning file at ``path`` for the job file ``job``, holding ``observations``."""
    measured = BatchTuning(batch=8, observations=observations)
    tuning = TuningFile(
        method="ngram",
        identity=tuning_identity(load_spec(job)),
        engines={"vllm": EngineTuning(k_grid=[0, 3], batches=[measured])},
    )
    write_tuning(path, tuning)


def edit_tuning(path: Path, change: Callable[[TuningFile], None]) -> None:
    """The tuning file at ``path`` read, changed in place by ``change``, and written back."""
    tuning = read_tuning(path)
    assert tuning is not None, path
    change(tuning)
    write_tuning(path, tuning)
