"""Planner: deterministic, single-domain units that cover every row exactly once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.errors import UserError
from batchspec.io.planner import plan_units
from batchspec.io.reader import read_unit_table


def make_input(path: Path, n: int, domains: list[str | None], row_group_size: int = 7) -> Path:
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(n)],
            "domain": [domains[i % len(domains)] for i in range(n)],
            "prompt": [f"p{i}" for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def test_units_cover_each_row_once_and_are_single_domain(tmp_path: Path) -> None:
    files = [
        make_input(tmp_path / "a.parquet", 50, ["x", "y", None]),
        make_input(tmp_path / "b.parquet", 13, ["y"]),
    ]
    units = plan_units(files, 8, "domain")
    seen: list[str] = []
    for u in units:
        t = read_unit_table(u, ["id", "domain"], "domain")
        assert t.num_rows == u.num_rows > 0
        assert set(t.column("domain").to_pylist()) == {u.domain}
        seen += t.column("id").to_pylist()
    expected = [f"r{i}" for i in range(50)] + [f"r{i}" for i in range(13)]
    assert sorted(seen) == sorted(expected)
    assert len({u.unit_id for u in units}) == len(units)
    assert plan_units(files, 8, "domain") == units


def test_without_domain_column(tmp_path: Path) -> None:
    f = make_input(tmp_path / "a.parquet", 20, ["x"])
    units = plan_units([f], 6, None)
    assert [(u.start, u.stop, u.domain) for u in units] == [
        (0, 6, None),
        (6, 12, None),
        (12, 18, None),
        (18, 20, None),
    ]


def test_limit_keeps_first_rows_across_files(tmp_path: Path) -> None:
    files = [
        make_input(tmp_path / "a.parquet", 5, ["x"]),
        make_input(tmp_path / "b.parquet", 9, ["x"]),
    ]
    units = plan_units(files, 4, "domain", limit=7)
    assert sum(u.num_rows for u in units) == 7
    assert [(u.file_index, u.start, u.stop) for u in units] == [(0, 0, 4), (0, 4, 5), (1, 0, 2)]


def test_unit_ids_distinct_for_similar_domain_names(tmp_path: Path) -> None:
    f = make_input(tmp_path / "a.parquet", 4, ["Q&A", "q a"])
    ids = [u.unit_id for u in plan_units([f], 4, "domain")]
    assert len(set(ids)) == 2


def test_missing_domain_column(tmp_path: Path) -> None:
    f = make_input(tmp_path / "a.parquet", 4, ["x"])
    with pytest.raises(UserError, match=r"input\.domain_column 'topic' is not a column"):
        plan_units([f], 4, "topic")


def test_not_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(UserError, match=r"bad\.parquet: not a readable Parquet file"):
        plan_units([bad], 4, None)
