"""Jobs to interrupt, and the exactly-once oracle for their output directories.

Why here and not in batchspec: ``check_output`` is the tests' independent oracle. The product
proves exactly-once itself when it exports (``batchspec.observe.export`` compares every
committed id with the input's, row for row); a test that checked the product with the
product's own check would pass whenever both were wrong the same way. This oracle reads the
parts with plain pyarrow and knows nothing of units, leases or the planner.
``scripts/bench/resume.py``, which may not import from tests, verifies with ``batchspec
export`` instead.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from conftest import PROMPTS, job_dict, write_job


def committed(out: Path) -> int:
    """Units committed in an output directory."""
    parts = out / "parts"
    return len(list(parts.glob("*.parquet"))) if parts.is_dir() else 0


def check_output(out: Path, expected_ids: list[str]) -> None:
    """Every input id exactly once; every part readable in full; no temporary file left."""
    ids: list[str] = []
    for part in sorted((out / "parts").glob("*.parquet")):
        ids += pq.read_table(part).column("id").to_pylist()
    dupes = len(ids) - len(set(ids))
    assert dupes == 0, f"{dupes} duplicate ids"
    assert sorted(ids) == sorted(expected_ids), "output ids differ from input ids"
    leftovers = [p.name for p in (out / "parts").iterdir() if p.suffix != ".parquet"]
    assert not leftovers, f"temporary files left in parts/: {leftovers}"


TREE_ENGINE = {"tree": {"max_depth": 2}, "num_speculative_tokens": 2, "adaptive": False}
"""Small n-gram trees on the tree engine, in the worker's process: a start of seconds where
vLLM's takes ~20-40 s here (a vLLM import in each of two processes). For tests of what
workers, launchers and schedulers do, which no engine takes part in; vLLM's own processes
under kills and signals are ``test_interrupts``', ``test_orphans``' and ``test_crash``'s."""


def resume_job(
    tmp: Path, rows: int, unit_rows: int, max_tokens: int, speculative: dict | None = None
) -> tuple[Path, list[str]]:
    """The default job over the first ``rows`` prompts in small units (many commits to
    interrupt), output in ``tmp/out``; returns the job file and the input ids.
    ``speculative`` overrides keys of the job's section (``TREE_ENGINE``: the tree engine).

    It records progress at every heartbeat and beats often, so that what a kill loses is
    measured precisely (``scripts/bench/resume.py --job`` reads those records).
    """
    table = pq.read_table(PROMPTS).slice(0, rows)
    pq.write_table(table, tmp / "in.parquet")
    job = job_dict(
        tmp / "out",
        input={"path": str(tmp / "in.parquet")},
        output={"unit_rows": unit_rows},
        sampling={"max_tokens": max_tokens},
        execution={"heartbeat_s": 0.2, "lease_timeout_s": 60},
        speculative=speculative or {},
    )
    return write_job(tmp / "job.yaml", job), table.column("id").to_pylist()
