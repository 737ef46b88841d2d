"""The CLI's help: bare ``batchspec`` shows it and exits 0, ``-h`` works on every command, each
command's help ends with examples, and the command lists are not cut short; ``--verbose``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import run_cli

from batchspec.cli import main
from batchspec.cli.common import VERBOSE_ENV


def commands(group: click.Group = main, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``group``, as the words that name it."""
    found = []
    for name, cmd in sorted(group.commands.items()):
        found.append((*path, name))
        if isinstance(cmd, click.Group):
            found += commands(cmd, (*path, name))
    return found


def test_bare_batchspec_prints_help_and_exits_0() -> None:
    result = run_cli()
    assert result.returncode == 0, result.stderr
    assert "Commands:" in result.stdout and "Examples:" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("words", [(), *commands()], ids=lambda w: " ".join(w) or "batchspec")
def test_every_help_takes_h_and_shows_examples(words: tuple[str, ...]) -> None:
    short = CliRunner().invoke(main, [*words, "-h"])
    assert short.exit_code == 0, short.output
    assert short.output == CliRunner().invoke(main, [*words, "--help"]).output
    assert "-h, --help" in short.output
    examples = short.output.split("Examples:\n", 1)[1].splitlines()
    # Kept as written (click's \b), each a command line.
    assert examples and all(line.startswith("    batchspec ") for line in examples), examples


@pytest.mark.parametrize("words", [(), ("slurm",), ("models",)], ids=str)
def test_command_lists_are_not_cut_short(words: tuple[str, ...]) -> None:
    listing = CliRunner().invoke(main, [*words, "-h"]).output.split("Commands:\n", 1)[1]
    entries = listing.split("\n\n", 1)[0].splitlines()
    assert len(entries) >= 2
    assert not any(line.rstrip().endswith("...") for line in entries), entries


@pytest.mark.parametrize("command", ["run", "tune", "verify"])
def test_verbose_sets_the_environment_before_the_command_runs(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    # The job does not exist: the command fails at once, after its options were read.
    result = CliRunner().invoke(main, [command, str(tmp_path / "none.yaml"), "--verbose"])
    assert result.exit_code == 2 and "cannot read job spec" in result.stderr
    assert os.environ.get(VERBOSE_ENV) == "1"
    monkeypatch.delenv(VERBOSE_ENV)
    CliRunner().invoke(main, [command, str(tmp_path / "none.yaml")])
    assert VERBOSE_ENV not in os.environ


def test_slurm_submit_verbose_passes_it_to_the_tasks(job_file) -> None:
    result = CliRunner().invoke(
        main, ["slurm", "submit", str(job_file()), "--dry-run", "--verbose"]
    )
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if " -m batchspec run " in x]
    assert "--verbose" in line
    os.environ.pop(VERBOSE_ENV, None)  # the in-process option set it


def test_helps_send_the_reader_to_docs_that_exist() -> None:
    """A help that points at the docs ("docs/PAGE.md: heading") names a page and a heading
    that exist; the README's command table lists every command."""
    root = Path(__file__).resolve().parents[1]
    for words in commands():
        text = " ".join(CliRunner().invoke(main, [*words, "-h"]).output.split())
        assert "README:" not in text, words
        for page, heading in re.findall(r"\((docs/[\w-]+\.md): ([^)]+)\)", text):
            titles = re.findall(r"^#+ (.+)$", (root / page).read_text(), re.M)
            assert any(heading in t.replace("`", "") for t in titles), (words, page, heading)
    table = (root / "README.md").read_text().split("## Commands")[1].split("\n\n")[1]
    for name in main.commands:
        assert f"| `batchspec {name}" in table, name


def test_commands_ask_torch_for_huge_pages_unless_told_otherwise(monkeypatch) -> None:
    """The group sets THP_MEM_ALLOC_ENABLE before any command imports torch (a plain step
    ~5 % faster on the CPU); a value in the environment is kept."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert CliRunner().invoke(main, ["validate", "-h"]).exit_code == 0
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert CliRunner().invoke(main, ["validate", "-h"]).exit_code == 0
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"
