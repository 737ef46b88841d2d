"""The shipped prompt set is the build of its JSONL source (the data, not code, is edited).

The build script is run as the user runs it (``--check``), so the test needs no import from
``scripts/``; a second check against a changed copy shows that ``--check`` can fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import PROMPTS, ROOT

BUILD = ROOT / "scripts" / "data" / "build.py"


def check(parquet: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(BUILD), "prompts", "--check", "--out", str(parquet)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_parquet_is_built_from_the_jsonl(tmp_path: Path) -> None:
    result = check(PROMPTS)
    assert result.returncode == 0, f"rebuild: python scripts/data/build.py prompts\n{result}"
    assert "matches" in result.stdout
    table = pq.read_table(PROMPTS)
    assert table.num_rows == 360
    changed = tmp_path / "changed.parquet"
    pq.write_table(table.slice(1), changed)
    assert check(changed).returncode == 1


@pytest.mark.parametrize("name", ["records", "stdlib"])
def test_generated_sets_are_their_builds(name: str) -> None:
    """records.parquet and stdlib.parquet are what their builders write (``--check``)."""
    if name == "stdlib" and sys.version_info[:2] != (3, 11):
        pytest.skip("the held-out set was built from Python 3.11's standard library")
    done = subprocess.run(
        [sys.executable, str(BUILD), name, "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"rebuild: python scripts/data/build.py {name}\n{done}"
