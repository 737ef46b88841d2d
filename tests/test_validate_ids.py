"""Null and duplicate ids are found before anything runs, with the first offending id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from test_cli_errors import assert_user_error

from batchspec.errors import UserError
from batchspec.io import ids
from batchspec.io.ids import check_ids


def write_ids(path: Path, values: list, row_group_size: int = 1000) -> Path:
    pq.write_table(pa.table({"id": values, "prompt": ["p"] * len(values)}), path, row_group_size)
    return path


def test_unique_ids_pass(tmp_path: Path) -> None:
    a = write_ids(tmp_path / "a.parquet", [f"r{i}" for i in range(70000)])
    b = write_ids(tmp_path / "b.parquet", [f"s{i}" for i in range(500)])
    check_ids([a, b], "id")


def test_first_duplicate_is_named_with_both_places(tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(100000)]
    values[90000] = "r70000"  # the first repeat in input order
    values[95000] = "r10"
    a = write_ids(tmp_path / "a.parquet", values, row_group_size=30000)
    with pytest.raises(UserError, match=r"id 'r70000' at row 90000 repeats the id at row 70000"):
        check_ids([a], "id")


def test_duplicate_across_files_and_integer_ids(tmp_path: Path) -> None:
    a = write_ids(tmp_path / "a.parquet", list(range(10)))
    b = write_ids(tmp_path / "b.parquet", [10, 11, 3])
    where = r"b\.parquet: .*id 3 at row 2 repeats the id at .*a\.parquet row 3"
    with pytest.raises(UserError, match=where):
        check_ids([a, b], "id")
    check_ids([a, b], "id", limit=12)  # the repeat lies past the rows the job will run


def test_null_id_is_named_by_row(tmp_path: Path) -> None:
    a = write_ids(tmp_path / "a.parquet", ["x", "y", None, "z"])
    with pytest.raises(UserError, match=r"a\.parquet: input\.id_column 'id' is null at row 2"):
        check_ids([a], "id")


def test_hash_collisions_are_not_reported_as_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ids, "_hashes", lambda a: np.zeros(len(a), dtype=np.uint64))
    check_ids([write_ids(tmp_path / "a.parquet", ["a", "b", "c"])], "id")


def test_validate_exits_2_on_duplicate_ids(job_file, tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(20)]
    values[7] = "r3"
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"id": values, "prompt": [f"say {i}" for i in range(20)]}), path)
    spec = {"path": str(path), "prompt_column": "prompt", "messages_column": None}
    job = job_file(input=spec | {"domain_column": None, "passthrough_columns": []})
    assert_user_error(run_cli("validate", str(job)), "dup.parquet", "'r3' at row 7")
