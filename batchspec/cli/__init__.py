"""Command line: ``batchspec run | validate | tune | verify | status | report | export | slurm |
models``.

User mistakes (``UserError``) print one line and exit 2, with no traceback; everything else is
a bug and keeps its traceback. Commands import the heavy parts (vLLM, polars) only when run.
"""

from __future__ import annotations

import os

import click

from batchspec.cli import cluster, jobs, observe, verify


def _quiet_libraries() -> None:
    """vLLM and transformers log at INFO by default; a batch job wants its own summary only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@click.group()
@click.version_option(package_name="batchspec")
def main() -> None:
    """Batch offline generation over Parquet with speculative decoding on vLLM."""
    _quiet_libraries()


for command in (jobs.run, jobs.validate, jobs.tune, observe.status, observe.report, observe.export):
    main.add_command(command)
main.add_command(verify.verify)
main.add_command(cluster.slurm)
main.add_command(cluster.models)
