"""A worker's periodic writes on a shared filesystem (issue 25): one record that is both its
heartbeat and its progress, kept after it ends or dies; and what a unit's commit, a claim walk
and the shared stats no longer pay for (no engine)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa

from batchspec.io.layout import OutDir
from batchspec.io.writer import Commit, PartWriter, output_schema
from batchspec.observe.status import run_status
from batchspec.spec.tree import VLLM
from batchspec.speculation import shared
from batchspec.speculation.estimator import Observation
from batchspec.speculation.shared import SharedStats
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work import indexes
from batchspec.work.indexes import DoneIndex
from batchspec.work.leases import Leases
from batchspec.work.progress import ProgressLog, read_records


def result(start: int, rows: int = 4) -> UnitResult:
    unit = WorkUnit(0, "in.parquet", start, start + rows, None, rows)
    reqs = [RowRequest(i, f"r{i}", None, {}) for i in range(start, start + rows)]
    results = [RowResult(r, "t", 3, 10, "stop") for r in reqs]
    return UnitResult(UnitRequests(unit, reqs), results, 0, "none", VLLM)


def worker(out: OutDir, name: str, timeout_s: float = 60, beat_s: float = 10) -> ProgressLog:
    leases = Leases(out, name, timeout_s, beat_s, progress=lambda: {"u9": 2})
    return ProgressLog(out, name, "run", leases)


def test_one_record_is_the_heartbeat_and_the_progress_and_is_kept(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    log = worker(out, "w1")
    leases = log._leases
    leases.start()
    log.committed(result(0))
    live = json.loads(out.progress("w1").read_text())
    assert live["rows_committed"] == 4 and live["units"] == {"u9": 2} and live["beat_s"] == 10
    assert not out.progress_record("w1").exists()  # one record while it runs, not two
    assert [r["rows_committed"] for r in read_records(out)] == [4]
    assert leases.live_workers() == 1
    leases.stop()  # as Worker.run ends: leases first, then the final record
    log.end()
    assert not out.progress("w1").exists()  # no longer counted live
    kept = json.loads(out.progress_record("w1").read_text())
    assert kept["ended"] and kept["rows_committed"] == 4
    assert [r["rows_committed"] for r in read_records(out)] == [4]


def test_a_commit_is_a_beat_and_the_next_beat_counts_from_it(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    log = worker(out, "w1", timeout_s=60, beat_s=2.0)
    log._leases.start()
    try:
        time.sleep(1.0)
        at = log.write()["time"]  # a commit's write, a second after the first beat
        time.sleep(1.5)  # a fixed period would have beaten at 2 s; from the commit: at 3 s
        assert json.loads(out.progress("w1").read_text())["time"] == at
        time.sleep(1.0)
        assert json.loads(out.progress("w1").read_text())["time"] > at
    finally:
        log._leases.stop()


def test_a_dead_workers_record_is_kept_by_whoever_takes_its_lease(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    dead = worker(out, "dead", timeout_s=0.3, beat_s=0.1)
    assert dead._leases.try_claim("u1")
    dead.committed(result(0))  # its last beat: then it is killed
    old = Leases(out, "old", 0.3, 0.1)  # a bare heartbeat, as an older batchspec writes it
    assert old.try_claim("u2")
    old.beat()
    taker = Leases(out, "taker", 0.3, 0.1)
    assert not taker.try_claim("u1") and not taker.try_claim("u2")  # first look: watched
    time.sleep(0.5)  # silent for the timeout of the taker's own clock
    assert taker.try_claim("u1") and taker.try_claim("u2")
    assert not out.progress("dead").exists() and not out.progress("old").exists()
    assert out.progress_record("old").exists()  # moved: its leases are free for everyone
    (kept,) = read_records(out)
    assert kept["worker"] == "dead" and kept["rows_committed"] == 4 and not kept["ended"]
    assert taker.live_workers() == 1
    assert [w["state"] for w in run_status_workers(out)] == ["dead"]


def run_status_workers(out: OutDir) -> list[dict]:
    (out.root / "manifest.json").write_text(
        json.dumps(
            {
                "spec_hash": "x",
                "input_fingerprint": "y",
                "limit": None,
                "num_units": 5,
                "num_rows": 20,
                "created": time.time(),
                "version": "0",
            }
        )
    )
    return run_status(out, lease_timeout_s=0.3).workers


def test_records_of_an_older_version_still_add_up(tmp_path: Path) -> None:
    """An output directory of the version before: records in progress/, bare heartbeats in
    leases/; both still read (the bare ones for status's rows per lease only)."""
    out = OutDir(tmp_path)
    old = ProgressLog(out, "before", "run")  # no leases: its record goes to progress/
    old.committed(result(0))
    out.leases.mkdir()
    out.progress("before").write_text(json.dumps({"worker": "before", "time": 0, "units": {}}))
    new = worker(out, "after")
    new.committed(result(4))
    records = sorted(read_records(out), key=lambda r: r["worker"])
    assert [(r["worker"], r["rows_committed"]) for r in records] == [("after", 4), ("before", 4)]


def test_a_commit_makes_its_directory_once_not_per_unit(tmp_path: Path, monkeypatch) -> None:
    out = OutDir(tmp_path)
    writer = PartWriter(out, output_schema(pa.string(), {}))
    made = []
    real = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: made.append(p) or real(p, *a, **k))
    assert writer.commit(result(0))[0] is Commit.COMMITTED  # parts/ missing: made
    assert writer.commit(result(4))[0] is Commit.COMMITTED
    assert writer.commit(result(0))[0] is Commit.DISCARDED
    assert len(made) == 1 and sorted(out.committed_units()) == sorted(
        [result(0).unit.unit_id, result(4).unit.unit_id]
    )


def test_a_paced_read_opens_a_few_files_at_a_fleets_start(tmp_path: Path) -> None:
    """20 workers' files appear at once: a K controller opens 8, then the others in turn
    (not 20 at once: at 1,000 workers that was 10^6 opens at start-up)."""
    out = OutDir(tmp_path)
    ob = Observation("a", 3, 8, rows=10, output_tokens=100, running_s=1.0)
    for i in range(1, 21):
        SharedStats(out, f"w{i:02d}").append(ob)
    me = SharedStats(out, "w00")
    me.append(ob)  # ours: never read back
    assert [len(me.read_paced()) for _ in range(3)] == [shared.FIRST_FILES] * 2 + [4]
    assert me.read_new() == [] and len(SharedStats(out, "report").read_new()) == 21


def test_a_listing_found_out_of_date_is_made_again_at_the_next_look(
    tmp_path: Path, monkeypatch
) -> None:
    """A walk over units committed since the listing (the stretch another worker was left)
    lists their directory once, not a claim attempt per unit."""
    monkeypatch.setattr(indexes, "LIST_S", 8.0)
    out = OutDir(tmp_path)
    ids = [result(4 * i).unit.unit_id for i in range(3)]
    done = DoneIndex(out)
    assert not done.done(ids[0])
    writer = PartWriter(out, output_schema(pa.string(), {}))
    for i in range(3):
        writer.commit(result(4 * i))
    done.stale(ids[0])  # listed just now: not again yet
    assert not done.done(ids[1])
    time.sleep(1.1)  # older than an eighth of LIST_S
    done.stale(ids[0])
    assert done.done(ids[1]) and done.done(ids[2])


def test_units_listed_as_held_are_passed_over_until_they_could_be_free(
    tmp_path: Path, monkeypatch
) -> None:
    """Walking where others work, a unit the listing of leases/ shows held is passed over
    with no claim attempt and looked at again once its holder could have been silent for a
    lease timeout, or sooner once the listing no longer shows it (handed back, committed)."""
    from batchspec.work import claims as claims_mod
    from batchspec.work.claims import Claims, FailureLog

    monkeypatch.setattr(indexes, "HELD_S", 0.0)  # the listing: a few ms old at most
    monkeypatch.setattr(claims_mod, "REVISIT_S", 0.0)
    out = OutDir(tmp_path)
    units = [result(4 * i).unit for i in range(3)]
    other = Leases(out, "other", 60, 10)
    other.beat()
    assert other.try_claim(units[1].unit_id)
    me = Leases(out, "me", 60, 10)
    attempts: list[str] = []
    real = me.try_claim
    me.try_claim = lambda uid: attempts.append(uid) or real(uid)  # type: ignore[method-assign]
    claims = Claims(out, me, FailureLog(out, "run"), set())
    claims._crowded = time.monotonic()  # we walk where others work
    assert not claims.claim(units[1]) and attempts == []  # listed: passed over
    claims._revisit_due()
    assert not claims._again  # held, and not yet possibly silent for a timeout
    other.release(units[1].unit_id)  # handed back: the listing no longer shows it held
    claims._revisit_due()
    assert [u.unit_id for u in claims._again] == [units[1].unit_id]


class Walk:
    """A scheduler's plan order, no more (``Claims`` asks for the next unit and the rows)."""

    def __init__(self, plan: list[WorkUnit]):
        self.queue = list(plan)
        self.rows = {None: sum(u.num_rows for u in plan)}

    def __bool__(self) -> bool:
        return bool(self.queue)

    def next_unit(self, k: int) -> WorkUnit | None:
        if not self.queue:
            return None
        self.rows[None] -= self.queue[0].num_rows
        return self.queue.pop(0)

    def take(self, unit_id: str) -> WorkUnit | None:
        unit = next((u for u in self.queue if u.unit_id == unit_id), None)
        if unit is not None:
            self.queue.remove(unit)
        return unit


def test_a_dead_workers_units_ahead_of_every_walk_are_taken_over_by_its_watcher(
    tmp_path: Path, monkeypatch
) -> None:
    """A worker killed mid-run holds the head of its stretch, which no walk reaches until its
    end: the worker before it by name watches its record, and takes its units over once the
    record is older than the lease timeout (and, at once, those of the next one in the
    ring, dead too): all their leases at once, the units handed out one per pull."""
    from batchspec.work import watch
    from batchspec.work.claims import Claims, FailureLog

    monkeypatch.setattr(watch, "WATCH_S", 0.0)
    out = OutDir(tmp_path)
    plan = [result(4 * i).unit for i in range(4)]
    dead = worker(out, "b-dead", timeout_s=0.3, beat_s=0.1)._leases
    dead.progress = lambda: {plan[0].unit_id: 1}
    assert dead.try_claim(plan[0].unit_id)
    dead.beat()  # its last beat: then it is killed, and so is the next one (one node)
    also = worker(out, "c-dead", timeout_s=0.3, beat_s=0.1)._leases
    also.progress = lambda: {plan[1].unit_id: 0}
    assert also.try_claim(plan[1].unit_id)
    also.beat()
    me = Leases(out, "a-watcher", 0.3, 0.1)
    me.beat()
    claims = Claims(out, me, FailureLog(out, "run"), set())
    walk = Walk(plan[2:] + plan[:2])  # its units at the end of our walk
    assert claims.next(walk, 0) == plan[2]  # alive yet: nothing to take over
    claims.watch.look()  # first look (the heartbeat thread's): watched from now
    ring = sorted(me.ring, key=watch.ring_key)
    assert ring == ["c-dead", "a-watcher", "b-dead"]  # hash order: b-dead, then c-dead
    time.sleep(0.5)
    me.beat()
    claims.watch.look()  # the heartbeat thread's look (not started here)
    got = [claims.next(walk, 0).unit_id]  # both leases taken over at once, one handed out
    assert {u.unit_id for u in plan[:2]} <= me.held
    got.append(claims.next(walk, 0).unit_id)
    assert set(got) == {u.unit_id for u in plan[:2]}
    assert not out.progress("b-dead").exists() and out.progress_record("c-dead").exists()
    assert claims.next(walk, 0) == plan[3]


class SlowWalk(Walk):
    """A walk that takes its time per unit, as 1,000 workers' walks over others' units do."""

    def next_unit(self, k: int) -> WorkUnit | None:
        time.sleep(0.1)
        return super().next_unit(k)


def test_a_watcher_in_a_long_walk_takes_a_dead_workers_units_over_mid_walk(
    tmp_path: Path, monkeypatch
) -> None:
    """A worker's own stretch done, its walk over units others committed can take long (in the
    1,000-worker simulation, minutes): the worker it watches dies meanwhile, and its units
    are taken over mid-walk, not once the walk is over (found 800-1,300 s after the kill)."""
    from batchspec.work import watch
    from batchspec.work.claims import Claims, FailureLog

    monkeypatch.setattr(watch, "WATCH_S", 0.1)
    out = OutDir(tmp_path)
    plan = [result(4 * i).unit for i in range(12)]
    writer = PartWriter(out, output_schema(pa.string(), {}))
    for i in range(1, 11):
        writer.commit(result(4 * i))  # committed by others: the walk passes them
    dead = worker(out, "b-dead", timeout_s=0.3, beat_s=0.1)._leases
    dead.progress = lambda: {plan[0].unit_id: 1}
    assert dead.try_claim(plan[0].unit_id)
    dead.beat()  # its last beat: then it is killed
    me = Leases(out, "a-watcher", 0.3, 0.1)
    me.start()
    try:
        claims = Claims(out, me, FailureLog(out, "run"), set())
        walk = SlowWalk(plan[1:] + plan[:1])  # ten done, one free, then the dead one's
        assert claims.next(walk, 0) == plan[0]  # stale after ~6 of the ten: taken mid-walk
        assert walk.queue and claims.next(walk, 0) == plan[11]
    finally:
        me.stop()


def test_a_dead_nodes_workers_are_taken_over_by_watchers_of_their_own(
    tmp_path: Path, monkeypatch
) -> None:
    """Two workers of one node die together. Their names sort together, but the watch ring is
    in hash order (here live1-b, node1-gpu0, live1-a, node1-gpu1), so each live worker takes
    over one dead worker's units, not one watcher both (which runs them one per pull)."""
    from batchspec.work import watch
    from batchspec.work.claims import Claims, FailureLog

    monkeypatch.setattr(watch, "WATCH_S", 0.0)
    out = OutDir(tmp_path)
    plan = [result(4 * i).unit for i in range(6)]
    for i, name in enumerate(["node1-gpu0", "node1-gpu1"]):
        dead = worker(out, name, timeout_s=0.3, beat_s=0.1)._leases
        dead.progress = lambda i=i: {plan[i].unit_id: 1}
        assert dead.try_claim(plan[i].unit_id)
        dead.beat()
    live = {n: Leases(out, n, 0.3, 0.1) for n in ["live1-a", "live1-b"]}
    claims = {n: Claims(out, le, FailureLog(out, "run"), set()) for n, le in live.items()}
    walks = {"live1-a": Walk(plan[2:4] + plan[:2]), "live1-b": Walk(plan[4:] + plan[:2])}
    for leases in live.values():
        leases.beat()
    for name in live:
        assert claims[name].next(walks[name], 0) not in plan[:2]  # alive yet
        claims[name].watch.look()  # first look: watched from now
    time.sleep(0.5)
    for name, leases in live.items():
        leases.beat()
        claims[name].watch.look()
    taken = {n: claims[n].next(walks[n], 0).unit_id for n in live}
    assert taken == {"live1-b": plan[0].unit_id, "live1-a": plan[1].unit_id}


def test_the_record_lists_every_unit_a_worker_holds_for_its_watcher(tmp_path: Path) -> None:
    """A watcher takes over the units a dead worker's record lists: those claimed ahead (not
    yet started) and a crash's suspects are leased too, so the record lists them (at 0 rows)
    beside the open units; a unit missing there waited for a walker's try (at 1,000 simulated
    workers the slowest waited 1,139 and 1,452 s after the kill, against a bound of 470)."""
    from batchspec.work.claims import Claims, FailureLog
    from batchspec.work.source import ClaimingSource
    from batchspec.work.stopping import StopFlag

    out = OutDir(tmp_path)
    ahead, running, suspect, taken = (result(4 * i).unit for i in range(4))
    claims = Claims(out, Leases(out, "me", 60, 10), FailureLog(out, "run"), set())
    claims.taken.append(taken)  # a dead worker's, taken over, not yet handed out
    source = ClaimingSource(None, claims, 0, None, StopFlag(1.0), 0.0, [ahead], 3)  # type: ignore[arg-type]
    requests = UnitRequests(running, [])
    requests.finished = 2
    source.open[running.unit_id] = requests
    source.quarantine.suspects[suspect.unit_id] = None  # type: ignore[assignment]
    held = {ahead.unit_id: 0, taken.unit_id: 0, suspect.unit_id: 0, running.unit_id: 2}
    assert source.progress() == held


def test_a_unit_gone_from_leases_is_looked_up_in_a_new_listing_of_parts_not_tried(
    tmp_path: Path, monkeypatch
) -> None:
    """At a fleet's end every worker that passed a unit looks at it once leases/ no longer
    lists it; one listing of its parts (not older than LIST_S / 8) tells that it was
    committed, where a claim attempt each raced the others' (conflicts, and a lease, a stat
    and an unlink per worker and unit)."""
    from batchspec.work import claims as claims_mod
    from batchspec.work.claims import Claims, FailureLog

    monkeypatch.setattr(indexes, "HELD_S", 0.0)
    monkeypatch.setattr(indexes, "LIST_S", 0.4)
    monkeypatch.setattr(claims_mod, "REVISIT_S", 0.0)
    out = OutDir(tmp_path)
    done = result(4)
    other = Leases(out, "other", 60, 10)
    other.beat()
    assert other.try_claim(done.unit.unit_id)
    claims = Claims(out, Leases(out, "me", 60, 10), FailureLog(out, "run"), set())
    claims._crowded = time.monotonic()
    assert not claims.claim(done.unit)  # listed as held: deferred, parts listed (none)
    PartWriter(out, output_schema(pa.string(), {})).commit(done)
    other.release(done.unit.unit_id)
    time.sleep(0.06)  # the parts' listing older than LIST_S / 8, younger than LIST_S
    claims._revisit_due()
    assert not claims._again and not claims.deferred
