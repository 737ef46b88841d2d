"""Commits and temporaries under hostile conditions: no hard links, racing committers, writers
killed with -9, a crash between writing the manifest and linking it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_writer import SCHEMA, UNIT, request, result_of

from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, claim_output_dir
from batchspec.io.temps import clean_stale_temps, host_tag
from batchspec.io.writer import Commit, PartWriter
from batchspec.units import RowResult

REAL_LINK = os.link
REAL_REPLACE = os.replace


def no_hard_links(src: object, dst: object) -> None:
    raise OSError(errno.EPERM, "hard links not supported")


def slow_replace(src: object, dst: object) -> None:
    time.sleep(0.05)  # widens the window in which a check-then-rename would let two win
    REAL_REPLACE(src, dst)


def test_without_hard_links_exactly_one_of_racing_committers_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "link", no_hard_links)
    monkeypatch.setattr(os, "replace", slow_replace)
    out = OutDir(tmp_path)
    writer = PartWriter(out, SCHEMA)
    outcomes: dict[str, Commit] = {}

    def commit(tag: str) -> None:
        outcomes[tag] = writer.commit(result_of([RowResult(request(0, tag), error=tag)]))[0]

    threads = [threading.Thread(target=commit, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [tag for tag, outcome in outcomes.items() if outcome is Commit.COMMITTED]
    assert len(winners) == 1 and len(outcomes) == 6
    assert pq.read_table(out.part(UNIT.unit_id)).column("error").to_pylist() == winners
    assert [p.name for p in out.parts.iterdir()] == [f"{UNIT.unit_id}.parquet"]


def test_a_filesystem_that_cannot_commit_atomically_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither hard links nor a rename that refuses to replace: two committers of one unit
    could both win there, so the run is refused before any work (the old fallback, a lock
    judged stale by its age, let a second committer overwrite the first)."""
    import ctypes

    from batchspec.errors import UserError
    from batchspec.io import temps

    class NoRename:
        def __init__(self, *_: object, **__: object) -> None:
            self.renameat2 = lambda *_: -1

    monkeypatch.setattr(os, "link", no_hard_links)
    monkeypatch.setattr(temps.ctypes, "CDLL", NoRename)
    monkeypatch.setattr(ctypes, "get_errno", lambda: errno.EINVAL)
    with pytest.raises(UserError, match="cannot commit parts atomically"):
        temps.check_commits(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    for folder in (out.parts, out.staged):
        folder.mkdir()
    dead, live = dead_pid(), os.getpid()
    host = host_tag()
    dead_part = out.parts / f".u1.parquet.{host}.{dead}.abc.tmp"
    live_part = out.parts / f".u2.parquet.{host}.{live}.abc.tmp"
    far_fresh = out.parts / ".u3.parquet.otherhost.12.abc.tmp"
    far_old = out.parts / ".u4.parquet.otherhost.12.abc.tmp"
    dead_stage = out.staged / f".in-0123.{host}.{dead}.abc.tmp"
    for p in (dead_part, live_part, far_fresh, far_old):
        p.write_bytes(b"x")
    dead_stage.mkdir()
    (dead_stage / "s000000000000.parquet").write_bytes(b"x")
    # Old by this host's clock: another host's writer may still run (its clock, or a pause,
    # cannot be judged from here), and a live writer here is never touched however old.
    for old in (far_old, live_part):
        os.utime(old, (time.time() - 100_000, time.time() - 100_000))
    committed = out.parts / "u5.parquet"
    committed.write_bytes(b"x")
    assert clean_stale_temps(out) == 2
    left = {p.name for p in out.parts.iterdir()} | {p.name for p in out.staged.iterdir()}
    assert left == {live_part.name, far_fresh.name, far_old.name, committed.name}


def test_manifest_is_synced_before_it_is_linked_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: set[int] = set()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    def link(src: str | Path, dst: str | Path) -> None:
        assert os.stat(src).st_ino in synced, "linked before fsync"
        REAL_LINK(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    out = OutDir(tmp_path / "out")
    manifest = Manifest("h", "f", None, 1, 1, 0.0, "v")
    assert claim_output_dir(out, manifest) == manifest
    assert [p.name for p in out.root.iterdir()] == ["manifest.json"]
