"""vLLM's IPC sockets in a folder of the worker's own (``engines.vllm_sockets``); that real
runs leave none behind, killed workers' included, is checked by ``test_interrupts``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchspec.engines import vllm_sockets


@pytest.fixture
def temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of the test's own, with a short path as a worker's ``/tmp`` has
    (pytest's are too long for a socket), and no folder made yet in this process."""
    path = Path(tempfile.mkdtemp(prefix="bs-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setattr(vllm_sockets, "_made", None)
    monkeypatch.delenv(vllm_sockets.ENV, raising=False)
    yield path
    shutil.rmtree(path)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_worker_gets_one_folder_for_its_life(temp: Path) -> None:
    vllm_sockets.use()
    mine = vllm_sockets.folder(os.getpid())
    assert os.environ[vllm_sockets.ENV] == str(mine) and mine.is_dir()
    assert mine.parent == temp and (mine.stat().st_mode & 0o777) == 0o700
    vllm_sockets.use()  # a second engine of the same process: the same folder
    assert os.environ[vllm_sockets.ENV] == str(mine)
    assert list(temp.iterdir()) == [mine]


def test_dead_workers_folders_are_swept_live_ones_kept(temp: Path) -> None:
    dead, alive = vllm_sockets.folder(dead_pid()), vllm_sockets.folder(os.getppid())
    other_host = temp / f"{vllm_sockets.PREFIX}0badc0de-{dead_pid()}"
    for path in (dead, alive, other_host):
        path.mkdir()
        (path / "socket").touch()
    vllm_sockets.use()
    assert not dead.exists()
    assert alive.exists() and other_host.exists()


def test_vllms_default_stands_where_a_socket_in_our_folder_would_be_too_long(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    longest = vllm_sockets.SOCKET_PATH_MAX - 1 - vllm_sockets.NAME_LEN
    room = longest - len(str(vllm_sockets.folder(os.getpid()))) - 1  # less the "/"
    deep = temp / ("d" * (room + 1))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    vllm_sockets.use()
    assert vllm_sockets.ENV not in os.environ and not list(deep.iterdir())
    fits = temp / ("d" * room)
    fits.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(fits))
    vllm_sockets.use()
    assert len(os.environ[vllm_sockets.ENV]) + 1 + vllm_sockets.NAME_LEN == 107


def test_a_users_own_folder_stands(temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_sockets.ENV, str(temp / "mine"))
    vllm_sockets.use()
    assert os.environ[vllm_sockets.ENV] == str(temp / "mine")
    assert not list(temp.iterdir())


def test_the_folder_goes_when_its_worker_exits_not_when_a_fork_does(temp: Path) -> None:
    """The worker's folder outlives a forked child's exit (it inherits the exit hook), and
    is removed at the worker's own exit with whatever vLLM left in it."""
    script = f"""
import os, sys, tempfile
tempfile.tempdir = {str(temp)!r}
from batchspec.engines import vllm_sockets
vllm_sockets.use()
open(os.path.join(os.environ[vllm_sockets.ENV], "socket"), "w").close()
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit: its exit hooks run
os.waitpid(pid, 0)
assert os.path.exists(os.environ[vllm_sockets.ENV]), "removed by the fork's exit"
print(os.environ[vllm_sockets.ENV])
"""
    env = {k: v for k, v in os.environ.items() if k != vllm_sockets.ENV}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.strip())
    assert folder.parent == temp and not folder.exists()


def test_vllms_rendezvous_file_goes_in_the_folder(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file vLLM's workers meet in (one per engine start) lands in the worker's folder,
    which goes with it; with a user's own socket folder, where vLLM puts it."""
    vllm_sockets.use()
    made = vllm_sockets.folder(os.getpid())
    assert vllm_sockets.file_store_init_method().startswith(f"file://{made}/vllm_dist_")
    monkeypatch.setenv(vllm_sockets.ENV, str(temp / "mine"))
    assert vllm_sockets.file_store_init_method().startswith(f"file://{temp}/vllm_dist_")
