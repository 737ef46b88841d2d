"""A session-wide real one-node Slurm cluster for tests (see scripts/slurm_cluster.py).

Use it from a test module (or conftest.py) with ``from slurm_fixture import slurm_cluster``
(re-exporting the fixture makes pytest find it), then::

    def test_array(slurm_cluster, tmp_path):
        job = slurm_cluster.sbatch("--array=0-1", f"--output={tmp_path}/%A_%a.out", "--wrap=true")
        assert set(slurm_cluster.wait_for_jobs(job, timeout=60).values()) == {"COMPLETED"}

Subprocesses that call Slurm commands get ``env=slurm_cluster.env`` (it sets SLURM_CONF).
Tests are skipped, with the reason, where Slurm cannot be installed (not root, no apt-get).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from slurm_cluster import Cluster, ensure_installed

__all__ = ["Cluster", "slurm_cluster"]


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A started :class:`Cluster`, shared by the session and stopped at its end."""
    try:
        ensure_installed()
    except RuntimeError as e:
        pytest.skip(f"no Slurm here: {e}")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"), keep_dir=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
