"""What every command shares: one-line user errors, loading a spec, the common options."""

from __future__ import annotations

import functools
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
        # Relative to where the command runs, as a user typing a path expects.
        items.append(f"output.dir={Path(output).resolve()}")
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
limit_option = click.option(
    "--limit", type=click.IntRange(min=1), help="Only the first N rows of the input."
)
