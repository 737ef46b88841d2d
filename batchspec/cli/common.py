"""What every command shares: one-line user errors, loading a spec, the common options, the
examples at the end of each ``--help``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
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
    from batchspec.spec.file import load_spec

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


def at_least(name: str, floor: float, default: float, help: str) -> Callable[..., Any]:
    """An option taking a number no smaller than ``floor`` (an integer where ``default`` is
    one), its default shown: how the commands declare their counts, sizes and intervals, so
    that each help says its bound and default alike."""
    kind = click.IntRange if isinstance(default, int) else click.FloatRange
    return click.option(name, type=kind(min=floor), default=default, show_default=True, help=help)


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


@contextlib.contextmanager
def engine_output(spec: JobSpec, command: str) -> Iterator[Callable[..., None]]:
    """``tune`` and ``verify`` measure with engines whose output goes to a log of their own,
    ``OUT/runs/<command>-<worker>.log``, named on the terminal first; yields the ``echo``
    that keeps the command's own lines (its tables) on the terminal meanwhile."""
    from batchspec.engines.quiet import results_output
    from batchspec.io.layout import OutDir
    from batchspec.work.runlog import worker_name

    log = OutDir(spec.output_dir).engine_log(f"{command}-{worker_name()}")
    click.echo(f"engine output: {log}")
    with results_output(log) as echo:
        yield echo
