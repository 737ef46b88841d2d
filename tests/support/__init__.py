"""Test infrastructure the test modules share: a real one-node Slurm cluster (``slurm``) and
jobs and checks for interrupted runs (``runs``).

Tests import it as ``support`` (``from support.runs import check_output``), the way they import
``conftest``: pytest puts ``tests/`` on ``sys.path`` for the rootdir conftest (no
``__init__.py`` in ``tests/``). From the repository root the same code runs as
``python -m tests.support.slurm``; modules inside import each other relatively so that both
names work.
"""
