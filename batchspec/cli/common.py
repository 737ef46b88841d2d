"""What every command shares: one-line user errors, loading a spec, the common options, the
examples at the end of each ``--help``."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from batchspec.errors import UserError

if TYPE_CHECKING:
    from batchspec.spec import JobSpec


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a ``UserError`` as one line and exit with its code (2); anything else is a bug
    and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            click.echo(f"batchspec: error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def load_job(job: str, overrides: tuple[str, ...], output: str | None) -> JobSpec:
    from batchspec.spec_file import load_spec

    items = list(overrides)
    if output is not None:
        # Relative to where the command runs, as a user typing a path expects; quoted, since
        # --set values are YAML (a path holding ': ', '#' or a newline is still that path).
        items.append(f"output.dir={json.dumps(str(Path(output).resolve()))}")
    return load_spec(job, items)


job_argument = click.argument("job", type=click.Path(dir_okay=False))
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a spec key (value read as YAML); repeatable.",
)
output_option = click.option(
    "--output", type=click.Path(file_okay=False), help="Output directory instead of output.dir."
)
MAX_ROWS = 2**63 - 1
"""``--limit`` at most: row counts and offsets are 64-bit integers in Arrow and Parquet."""
limit_option = click.option(
    "--limit", type=click.IntRange(min=1, max=MAX_ROWS), help="Only the first N rows of the input."
)


VERBOSE_ENV = "BATCHSPEC_VERBOSE"
"""Set to 1 by ``--verbose``: the engines' own logs go to the terminal, not only to the run's
log file. Engine processes inherit it."""


def _set_verbose(_ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # Set while the command's options are parsed, so before any engine starts.
    if value:
        os.environ[VERBOSE_ENV] = "1"
    return value


def verbose_option(expose: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--verbose``; ``expose``: the command gets it as an argument too (to pass it on)."""
    return click.option(
        "--verbose",
        is_flag=True,
        callback=_set_verbose,
        expose_value=expose,
        help="Show the engines' own logs live (else they go to the run's log file only).",
    )


def examples(*lines: str) -> str:
    """A ``--help`` epilog of example command lines, kept as written (click's ``\\b``)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
