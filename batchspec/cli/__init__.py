"""Command line: ``batchspec run | validate | tune | verify | status | report | export |
run-batch | slurm | models``.

User mistakes (``UserError``) print one line and exit 2, with no traceback; everything else is
a bug and keeps its traceback. Commands import the heavy parts (vLLM, polars) only when run.
"""

from __future__ import annotations

import os

import click

from batchspec.cli import batch, cluster, distill, jobs, observe, verify
from batchspec.cli.common import examples


def _quiet_libraries() -> None:
    """vLLM and transformers log at INFO by default; a batch job wants its own summary only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _huge_pages() -> None:
    """Huge pages for torch's CPU allocations (the weights, the KV cache): read once, when
    torch is imported, which the commands do later. A plain batch-1 step of the embedded model
    ran 35.0 against 36.9 ms without (one thread, ABBA, 2026-12-05); set it to 0 to keep 4 KB
    pages."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


@click.group(
    # -h everywhere (subcommands inherit it); bare `batchspec` shows the help and exits 0.
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
    epilog=examples(
        "batchspec validate jobs/synth_data.yaml    # check a job; starts nothing",
        "batchspec run jobs/synth_data.yaml         # generate; run again to resume",
        "batchspec status out/synth_data            # from any node, while it runs",
        "batchspec report out/synth_data            # tokens/s, acceptance and K per domain",
        "batchspec export out/synth_data --to ds    # the rows as a Hugging Face dataset",
    ),
)
@click.version_option(package_name="batchspec")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Batch offline generation over Parquet with speculative decoding (on vLLM, or on
    batchspec's own draft-tree engine). COMMAND -h shows a command's options and examples."""
    _quiet_libraries()
    _huge_pages()
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


for command in (jobs.run, jobs.validate, jobs.tune, observe.status, observe.report, observe.export):
    main.add_command(command)
main.add_command(batch.run_batch)
main.add_command(verify.verify)
main.add_command(distill.distill)
main.add_command(cluster.slurm)
main.add_command(cluster.models)
