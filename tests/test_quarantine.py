"""The quarantine's bisection (orchestration only): which groups run alone after each crash,
which row becomes an error row, when a unit is given up. A toy engine crashes whenever a
group holds a poison row (or always, or once)."""

from __future__ import annotations

from collections.abc import Callable

from batchspec.spec.tree import VLLM
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work.quarantine import Quarantine


def unit(name: str, rows: int) -> UnitRequests:
    """A unit of its own domain (so its own id), rows with ids name0, name1, ..."""
    u = WorkUnit(0, "in.parquet", 0, rows, name, rows)
    return UnitRequests(u, [RowRequest(i, f"{name}{i}", None, {}) for i in range(rows)])


def ran(requests: UnitRequests) -> UnitResult:
    results = [RowResult(r, text=f"out {r.row_id}", num_output_tokens=1) for r in requests.rows]
    return UnitResult(requests, results, 3, "ngram", VLLM)


def drive(
    q: Quarantine, inflight: list[UnitRequests], crashes: Callable[[list[str]], bool]
) -> tuple[list[UnitResult], list[str], list[list[str]]]:
    """Crash with ``inflight``, then run the quarantine's groups alone until it is empty:
    (units completed, units given up, the row ids of every group run)."""
    done, failed, groups = [], [], []
    failed += q.crashed({r.unit.unit_id: r for r in inflight}, "boom")
    done += q.completed(3, "ngram", VLLM)
    while q:
        group = q.next_group()
        assert group is not None and q.next_group() is None  # one group at a time
        ids = [r.row_id for r in group.rows]
        groups.append(ids)
        if crashes(ids):
            failed += q.crashed({group.unit.unit_id: group}, "boom")
            done += q.completed(3, "ngram", VLLM)
        else:
            whole = q.finished(ran(group))
            done += [whole] if whole else []
    return done, failed, groups


def test_poison_row_is_bisected_to_an_error_row_and_innocents_complete() -> None:
    q = Quarantine(max_attempts=3)
    a, b = unit("a", 4), unit("b", 8)
    done, failed, groups = drive(q, [a, b], lambda ids: "b5" in ids)
    assert failed == []
    assert groups == [
        ["a0", "a1", "a2", "a3"],  # innocent: alone, commits
        [f"b{i}" for i in range(8)],  # crashes alone: split
        ["b0", "b1", "b2", "b3"],
        ["b4", "b5", "b6", "b7"],
        ["b4", "b5"],
        ["b4"],
        ["b5"],  # crashes alone: the error row
        ["b6", "b7"],
    ]
    by_unit = {r.unit.unit_id: r for r in done}
    assert [r.error for r in by_unit[a.unit.unit_id].results] == [None] * 4
    whole = by_unit[b.unit.unit_id]
    assert [r.request.row_id for r in whole.results] == [f"b{i}" for i in range(8)]
    errors = [r.request.row_id for r in whole.results if r.error]
    assert errors == ["b5"] and "dies on this row" in whole.results[5].error
    assert whole.unit_requests.finished == 8
    assert (whole.k, whole.method, whole.engine) == (3, "ngram", VLLM)
    assert q.attempts == {a.unit.unit_id: 1, b.unit.unit_id: 1}  # narrowing crashes are free


def test_engine_that_always_crashes_gives_units_up_after_max_attempts() -> None:
    q = Quarantine(max_attempts=2)
    a, b = unit("a", 4), unit("b", 4)
    done, failed, groups = drive(q, [a, b], lambda ids: True)
    # a alone, its halves down to a0 (narrowing, free); a1 crashes too: not narrowing.
    assert groups == [
        ["a0", "a1", "a2", "a3"],
        ["a0", "a1"],
        ["a0"],
        ["a1"],
        ["b0", "b1", "b2", "b3"],
    ]
    assert failed == [a.unit.unit_id, b.unit.unit_id] and done == []
    assert q.attempts == {a.unit.unit_id: 2, b.unit.unit_id: 2} and not q


def test_transient_crash_reruns_units_alone_without_error_rows() -> None:
    q = Quarantine(max_attempts=3)
    a, b, c = unit("a", 2), unit("b", 2), unit("c", 2)
    done, failed, groups = drive(q, [a, b, c], lambda ids: False)
    assert groups == [["a0", "a1"], ["b0", "b1"], ["c0", "c1"]] and failed == []
    assert all(r.error is None for u in done for r in u.results) and len(done) == 3


def test_two_poison_rows_cost_one_attempt_and_both_become_error_rows() -> None:
    q = Quarantine(max_attempts=3)
    a = unit("a", 4)
    done, failed, _ = drive(q, [a], lambda ids: "a0" in ids or "a3" in ids)
    assert failed == []
    assert [r.request.row_id for r in done[0].results if r.error] == ["a0", "a3"]
    assert done[0].engine == VLLM  # completed by a crash (a3 alone): the crashed engine's name
    assert q.attempts == {a.unit.unit_id: 2}  # the first crash, and a3's half after a0's


def test_retry_of_error_rows_keeps_positions() -> None:
    q = Quarantine(max_attempts=3)
    a = unit("a", 2)
    a.positions = [4, 9]
    done, _, _ = drive(q, [a], lambda ids: "a1" in ids)
    assert done[0].unit_requests.positions == [4, 9]
    assert [r.error is not None for r in done[0].results] == [False, True]
