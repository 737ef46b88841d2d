"""Leases: exclusive claims, heartbeats, takeover of dead or silent holders (no engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from batchspec.io.layout import OutDir
from batchspec.work.leases import Leases


def test_claim_is_exclusive_and_release_frees(tmp_path: Path) -> None:
    a = Leases(OutDir(tmp_path), "a", timeout_s=60, heartbeat_s=1)
    b = Leases(OutDir(tmp_path), "b", timeout_s=60, heartbeat_s=1)
    assert a.try_claim("u1")
    assert not b.try_claim("u1")
    assert a.held == {"u1"}
    b.release("u1")  # not b's: stays
    assert a.read("u1") is not None
    a.release("u1")
    assert a.read("u1") is None and b.try_claim("u1")


def test_silent_holder_is_taken_over_after_timeout(tmp_path: Path) -> None:
    a = Leases(OutDir(tmp_path), "a", timeout_s=0.4, heartbeat_s=0.1)
    b = Leases(OutDir(tmp_path), "b", timeout_s=0.4, heartbeat_s=0.1)
    assert a.try_claim("u1")
    assert not b.try_claim("u1")
    time.sleep(0.6)  # a never beats
    assert b.try_claim("u1")
    a.beat()  # a notices it lost the unit and forgets it
    assert a.held == set() and b.held == {"u1"}


def test_heartbeat_keeps_a_lease(tmp_path: Path) -> None:
    a = Leases(OutDir(tmp_path), "a", 0.5, 0.1, progress=lambda: {"u1": 3})
    b = Leases(OutDir(tmp_path), "b", timeout_s=0.5, heartbeat_s=0.1)
    a.try_claim("u1")
    a.start()
    try:
        time.sleep(1.0)
        assert not b.try_claim("u1")
        data = json.loads(a.progress_path.read_text())
        assert data["units"] == {"u1": 3} and data["worker"] == "a"
    finally:
        a.stop()
    assert not a.progress_path.exists()


def test_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    code = (
        "import sys; from batchspec.io.layout import OutDir; from batchspec.work.leases import "
        "Leases; assert Leases(OutDir(sys.argv[1]), 'dead', 3600, 60).try_claim('u1')"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    info = Leases(OutDir(tmp_path), "b", 3600, 60).read("u1")
    assert info is not None and info.holder.pid != os.getpid()
    assert Leases(OutDir(tmp_path), "b", timeout_s=3600, heartbeat_s=60).try_claim("u1")


def test_live_holder_elsewhere_is_respected(tmp_path: Path) -> None:
    a = Leases(OutDir(tmp_path), "a", 3600, 60)
    assert a.try_claim("u1")
    # A holder that claims to be on another host is judged by its heartbeat only.
    path = a.path("u1")
    data = json.loads(path.read_text()) | {"host": "other-node", "pid": 1}
    path.write_text(json.dumps(data))
    assert not Leases(OutDir(tmp_path), "b", 3600, 60).try_claim("u1")


def test_holder_that_cannot_be_inspected_counts_as_alive(monkeypatch) -> None:
    import psutil

    from batchspec.work import holders as leases

    other = leases.Holder("w", leases.socket.gethostname(), 424242, 1.0)

    def denied(pid: int) -> None:
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(leases.psutil, "Process", denied)
    assert not other.is_dead_here()  # AccessDenied: alive, the heartbeat timeout decides

    def hidden(pid: int) -> None:  # /proc mounted with hidepid: the process seems gone
        raise psutil.NoSuchProcess(pid)

    def kill(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(leases.psutil, "Process", hidden)
    monkeypatch.setattr(leases.os, "kill", kill)
    assert not other.is_dead_here()  # the kernel says it exists (another user's)

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(leases.os, "kill", gone)
    assert other.is_dead_here()
