"""Exactly once under a cluster's faults (issue 33): clock skew between hosts, filesystem
errors in the heartbeat and in listings, a committer paused past the lease timeout, a kill
during the commit. Each ends with every unit committed once and nothing of a live worker's
taken; no engine (the fleet simulator's scenario of a death while others linger is in
``test_fleet.py``)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_writer import SCHEMA, UNIT, request, result_of

from batchspec.io.layout import OutDir
from batchspec.io.temps import clean_stale_temps
from batchspec.io.writer import Commit, PartWriter
from batchspec.units import RowResult
from batchspec.work import heartbeat, indexes, leases
from batchspec.work.indexes import DoneIndex, FailureLog, HeldIndex
from batchspec.work.leases import Leases
from batchspec.work.watch import Watch

SKEW_S = 400.0


class SkewedTime:
    """``time`` as a host whose clock is ``SKEW_S`` ahead sees it (its monotonic clock runs
    at the same rate: only the wall clock is off)."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def time() -> float:
        return time.time() + SKEW_S


def test_clock_skew_never_takes_a_live_workers_leases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimant whose clock is 400 s ahead, against a holder whose records the file server
    stamps 400 s in the past: the holder beats, so nobody takes its lease or retires it
    (on ac4bc8a the claimant took every lease of the live holder at its first look); once it
    stops beating, the claimant takes the lease after a timeout of its own clock."""
    out = OutDir(tmp_path)
    holder = Leases(out, "holder", timeout_s=0.5, heartbeat_s=0.05)
    write = holder.heart._write

    def write_behind() -> None:  # the file server's clock is 400 s behind
        write()
        old = time.time() - SKEW_S
        os.utime(holder.progress_path, (old, old))

    holder.heart._write = write_behind
    assert holder.try_claim("u1")
    holder.start()
    monkeypatch.setattr(leases, "time", SkewedTime)
    monkeypatch.setattr(heartbeat, "time", SkewedTime)
    claimant = Leases(out, "claimant", timeout_s=0.5, heartbeat_s=0.05)
    claimant.beat()
    claimant.ring = ["claimant", "holder"]
    watch = Watch(claimant)
    try:
        deadline = time.monotonic() + 1.5  # three lease timeouts
        while time.monotonic() < deadline:
            assert not claimant.try_claim("u1")
            watch._at = -float("inf")
            watch.look()
            time.sleep(0.05)
        assert out.progress("holder").exists() and not claimant.orphans
    finally:
        holder.heart.stop()  # killed: no release
    assert not claimant.try_claim("u1")  # its last record: watched from now
    time.sleep(0.6)
    assert claimant.try_claim("u1")
    holder.release("u1")  # the holder, back after its stall, leaves the taker's lease alone
    assert claimant.read("u1").holder == claimant.me


def test_a_holder_with_a_longer_timeout_is_waited_for(tmp_path: Path) -> None:
    """Runs of one directory may set ``lease_timeout_s`` apart: a claimant waits the holder's
    longer timeout, not only its own."""
    out = OutDir(tmp_path)
    holder = Leases(out, "patient", timeout_s=1.0, heartbeat_s=0.4)
    holder.beat()
    assert holder.try_claim("u1")
    hasty = Leases(out, "hasty", timeout_s=0.2, heartbeat_s=0.05)
    assert not hasty.try_claim("u1")
    time.sleep(0.3)  # silent longer than the claimant's timeout, not the holder's
    holder.beat()
    assert not hasty.try_claim("u1")


def test_the_heartbeat_survives_transient_filesystem_errors(tmp_path: Path) -> None:
    """ESTALE three times in a row: the beat is tried again (0.5, 1, 2 s... at most a
    heartbeat apart) and the worker keeps its leases; on ac4bc8a the thread died at the
    first error and another worker took the live leases after the timeout."""
    out = OutDir(tmp_path)
    worker = Leases(out, "w", timeout_s=2.0, heartbeat_s=0.1)
    write, failures = worker.heart._write, [0]

    def flaky() -> None:
        if failures[0] < 3:
            failures[0] += 1
            raise OSError(errno.ESTALE, "Stale file handle")
        write()

    worker.heart._write = flaky
    lost: list[str] = []
    worker.heart.on_lost = lost.append
    assert worker.try_claim("u1")
    worker.start()
    try:
        time.sleep(0.8)
        assert failures[0] == 3 and out.progress("w").exists() and not lost
        before = heartbeat.version(out.progress("w"))
        time.sleep(0.3)
        assert heartbeat.version(out.progress("w")) != before  # beating again
    finally:
        worker.stop()


def test_a_worker_that_cannot_beat_stops_claiming(tmp_path: Path) -> None:
    """Beats failing for half a lease timeout: the worker is told to stop (``on_lost``: no
    more claims; ``run`` then exits 1), since others may soon take its units over."""
    out = OutDir(tmp_path)
    worker = Leases(out, "w", timeout_s=0.6, heartbeat_s=0.05)
    worker.beat()

    def broken() -> None:
        raise OSError(errno.EIO, "Input/output error")

    worker.heart._write = broken
    lost: list[str] = []
    worker.heart.on_lost = lost.append
    worker.start()
    try:
        time.sleep(0.8)
    finally:
        worker.stop()
    assert len(lost) == 1 and "could not be written" in lost[0] and "Input/output" in lost[0]


def test_listings_survive_filesystem_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO on a listing of parts, leases or failure records: not known, looked at again (the
    claim's own check under its lease decides); on ac4bc8a the worker crashed."""
    out = OutDir(tmp_path)
    claimant = Leases(out, "w", timeout_s=60, heartbeat_s=10)

    def eio(*_: object) -> list[str]:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(indexes.os, "listdir", eio)
    monkeypatch.setattr(leases.os, "listdir", eio)
    monkeypatch.setattr(out, "parts_in", eio)
    assert not DoneIndex(out).done(UNIT.unit_id)
    assert not HeldIndex(out).held(UNIT.unit_id)
    assert not FailureLog(out, "run").failed_in_this_run(UNIT.unit_id)
    assert claimant.live_workers() == 1


def test_a_paused_committer_keeps_its_temporary(tmp_path: Path) -> None:
    """A committer paused far longer than any timeout between writing its part and linking
    it: another worker's clean-up leaves its temporary alone (its pid lives here), and the
    link commits the unit; on ac4bc8a the clean-up removed it by age and the link failed
    with ENOENT, crashing the worker."""
    out = OutDir(tmp_path)
    writer = PartWriter(out, SCHEMA)
    write = writer._tmp

    def paused(unit_id: str) -> Path:
        tmp = write(unit_id)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(b"")
        old = time.time() - 100_000
        os.utime(tmp, (old, old))  # untouched for a day, by anyone's clock
        assert clean_stale_temps(out) == 0 and tmp.exists()
        return tmp

    writer._tmp = paused  # type: ignore[method-assign]
    outcome, _ = writer.commit(result_of([RowResult(request(0, "a"), error="a")]))
    assert outcome is Commit.COMMITTED and out.is_committed(UNIT.unit_id)


KILLED_COMMIT = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from test_writer import SCHEMA, request, result_of
from batchspec.io import writer as writer_mod
from batchspec.io.layout import OutDir
from batchspec.units import RowResult
from batchspec.work.leases import Leases

out = OutDir(sys.argv[1])
leases = Leases(out, "victim", 300, 20)
assert leases.try_claim(sys.argv[4])
link = writer_mod.link_new

def killed(src, dst):
    if sys.argv[3] == "after":
        link(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)

writer_mod.link_new = killed
writer_mod.PartWriter(out, SCHEMA).commit(result_of([RowResult(request(0, "v"), error="v")]))
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_kill_during_the_commit_leaves_the_unit_exactly_once(tmp_path: Path, when: str) -> None:
    """kill -9 just before or just after the part's link: the next worker on this host takes
    the dead one's lease at once, finds the unit committed (after) or not (before: its
    temporary is cleaned away), and the unit ends with one part of one copy of its rows."""
    out = OutDir(tmp_path)
    here = str(Path(__file__).parent)
    cmd = [sys.executable, "-c", KILLED_COMMIT, str(tmp_path), here, when, UNIT.unit_id]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert out.is_committed(UNIT.unit_id) is (when == "after")
    clean_stale_temps(out)
    survivor = Leases(out, "survivor", 300, 20)
    assert survivor.try_claim(UNIT.unit_id)  # its holder's pid is gone: at once
    if not out.is_committed(UNIT.unit_id):
        rows = [RowResult(request(0, "s"), error="s")]
        assert PartWriter(out, SCHEMA).commit(result_of(rows))[0] is Commit.COMMITTED
    survivor.release(UNIT.unit_id)
    assert [p.name for p in out.part_dir(UNIT.unit_id).iterdir()] == [f"{UNIT.unit_id}.parquet"]
    assert pq.read_table(out.part(UNIT.unit_id)).num_rows == 1


def test_a_damaged_line_of_shared_measurements_is_skipped(tmp_path: Path) -> None:
    """A torn or edited line in ``OUT/stats/<worker>.jsonl`` costs the K controller one
    measurement: every worker reads these files (on ac4bc8a: a JSONDecodeError that ended the
    worker, and ``status``/``report`` with a traceback)."""
    from batchspec.speculation.estimator import Observation
    from batchspec.speculation.shared import SharedStats

    out = OutDir(tmp_path)
    ob = Observation("a", 3, 8, rows=10, output_tokens=100, running_s=1.0)
    SharedStats(out, "w1").append(ob)
    with open(out.stats_file("w1"), "a") as fh:
        fh.write('{"domain": "a", "k": \n{"not": "an observation"}\n')
    SharedStats(out, "w1").append(ob)
    assert SharedStats(out, "w0").read_new() == [ob, ob]


def test_a_fresh_fanned_out_directory_is_cleaned_before_its_first_part(tmp_path: Path) -> None:
    """A run of 4,096 units or more records the fanned-out layout when it binds the
    directory; its workers clean temporaries before any part (or parts/) exists: found by
    the 1,000-worker simulation, where every worker died at start with FileNotFoundError."""
    from batchspec.io.layout import FANOUT
    from batchspec.io.manifest import Manifest, claim_output_dir

    out = OutDir(tmp_path)
    claim_output_dir(out, Manifest("s", "f", None, 5000, 5000, 0.0, "v", parts_layout=FANOUT))
    assert out.fanout and not out.parts.exists()
    assert clean_stale_temps(out) == 0 and out.part_files() == []
