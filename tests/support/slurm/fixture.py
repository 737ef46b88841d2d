"""A session-wide real one-node Slurm cluster for tests (see the package docstring).

conftest.py imports the fixture (``from support.slurm.fixture import slurm_cluster``), which
makes pytest find it in every test module::

    def test_array(slurm_cluster, tmp_path):
        job = slurm_cluster.sbatch("--array=0-1", f"--output={tmp_path}/%A_%a.out", "--wrap=true")
        assert set(slurm_cluster.wait_for_jobs(job, timeout=60).values()) == {"COMPLETED"}

Subprocesses that call Slurm commands get ``env=slurm_cluster.env`` (it sets SLURM_CONF).
Tests are skipped, with the reason, where Slurm cannot be installed (not root, no apt-get).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import Cluster
from .install import ensure_installed


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
