"""The docs stay true to the tree: links resolve, cited files exist, quoted commands run.

README.md and docs/*.md cite paths, commands and flags that other changes move or rename; a
reader who follows a dead link or types a flag that is gone loses trust in every page. These
checks read Markdown only (no engine starts).
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from batchspec.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
CITED_PATH = re.compile(
    r"^(?:batchspec|scripts|tests|jobs|docs|\.ci"
    r"|engines|io|speculation|measure|work|observe|cluster|cli)"
    r"/[\w./*-]*$|^[\w-]+\.(?:py|yaml|sh|toml)$"
)
"""A cited repository path: under a top-level or package folder, or a bare module file name."""
PATH_IN_BLOCK = re.compile(r"(?:scripts|jobs|tests|batchspec)/[\w./-]+\.(?:py|yaml|sh)")
COMMAND = re.compile(
    r"(^\s*|\$ |bin/|\s)batchspec ((?:slurm|models) [a-z]+|[a-z]+(?:-[a-z]+)*)\b([^|#;&]*)"
)
"""``batchspec CMD ...``: where it starts a quote (or follows ``$ `` or ``bin/``) CMD must be a
command; elsewhere (``ruff check batchspec tests``) only a real command's flags are checked."""
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code-block lines) of a Markdown page."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif inside:
            code.append(line)
        else:
            prose.append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in split(page.read_text())[0]:
        if m := re.match(r"^#{1,6} (.+)$", line):
            base = slug(m[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> Iterator[str]:
    for line in split(page.read_text())[0]:
        for target in LINK.findall(line):
            if not re.match(r"^[a-z]+:", target):
                yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{page.name}: {broken}"


def exists(cited: str) -> bool:
    """A cited path, from the repository root or the package, or a module file anywhere."""
    cited = cited.split("::")[0]
    for base in (ROOT, ROOT / "batchspec"):
        if list(base.glob(cited.rstrip("/"))):
            return True
    if "/" not in cited:
        return any(
            any((ROOT / top).rglob(cited)) for top in ("batchspec", "scripts", "tests", "jobs")
        )
    return False


def cited_paths(page: Path) -> Iterator[str]:
    prose, code = split(page.read_text())
    for line in prose:
        for span in CODE_SPAN.findall(line):
            if CITED_PATH.match(span.split("::")[0]):
                yield span
            else:
                yield from PATH_IN_BLOCK.findall(span)
    for line in code:
        yield from PATH_IN_BLOCK.findall(line)


RETIRED = re.compile(r"git show ([0-9a-f]{7,40}):(scripts/[\w./-]+\.py)")
"""A retired script, with the commit to take it from (docs/benchmarks.md, Retired benchmarks)."""


@functools.cache
def retired(page: Path = ROOT / "docs" / "benchmarks.md") -> dict[str, str]:
    """The retired scripts a page says how to take from their commits: it may name them (their
    transcripts); other pages, tests and job files may not."""
    if page.suffix != ".md":
        return {}
    return {path: commit for commit, path in RETIRED.findall(page.read_text())}


def test_retired_scripts_are_gone_and_at_their_commit() -> None:
    here = sorted(p for p in retired() if (ROOT / p).exists())
    assert not here, f"retired in docs/benchmarks.md but still in the tree: {here}"
    if not shutil.which("git"):
        pytest.skip("no git")

    def has(obj: str) -> bool:
        done = subprocess.run(["git", "cat-file", "-e", obj], cwd=ROOT, capture_output=True)
        return done.returncode == 0

    # A commit this clone lacks (shallow) is not checked; one it has must hold the script.
    named = {x for page in PAGES for x in RETIRED.findall(page.read_text())}
    absent = sorted(f"{c}:{p}" for c, p in named if has(f"{c}^{{commit}}") and not has(f"{c}:{p}"))
    assert not absent, f"the docs' git show lines: no such script at that commit: {absent}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_file_exists(page: Path) -> None:
    missing = sorted({c for c in cited_paths(page) if not exists(c) and c not in retired(page)})
    assert not missing, f"{page.name} cites files that do not exist: {missing}"


def command_uses(page: Path) -> Iterator[tuple[str, str, bool]]:
    """(command, the rest of the quoted line, whether it starts a command line) for every
    ``batchspec CMD`` in code."""
    prose, code = split(page.read_text())
    quoted = [span for line in prose for span in CODE_SPAN.findall(line)] + code
    for text in quoted:
        for m in COMMAND.finditer(text):
            yield m[2], m[3].split(" -- ")[0], not m[1].isspace() or m.start() == 0


def resolve(name: str) -> click.Command | None:
    group: click.Command | None = main
    for part in name.split():
        group = group.commands.get(part) if isinstance(group, click.Group) else None
    return group


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_command_and_flag_exists(page: Path) -> None:
    wrong = []
    for name, rest, leads in command_uses(page):
        cmd = resolve(name)
        if cmd is None:
            if leads:
                wrong.append(f"batchspec {name}: no such command")
            continue
        known = {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        wrong += [
            f"batchspec {name} {f}: no such flag" for f in FLAG.findall(rest) if f not in known
        ]
    assert not wrong, f"{page.name}: {sorted(set(wrong))}"


def test_readme_is_a_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail into docs/"
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in lines, "CI's command"


SCRIPT = re.compile(r"(?<![\w/.])scripts/[\w./-]+\.(?:py|sh)\b")
"""A script named anywhere: in prose, code, a test or a job file (a stale path fails)."""
SCRIPT_TEXTS = [*PAGES, *sorted((ROOT / "tests").rglob("*.py")), *sorted(ROOT.glob("jobs/*.yaml"))]


@pytest.mark.parametrize("text", SCRIPT_TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_script_exists(text: Path) -> None:
    found = SCRIPT.findall(text.read_text())
    missing = sorted({s for s in found if not (ROOT / s).is_file() and s not in retired(text)})
    assert not missing, f"{text.name} names scripts that do not exist: {missing}"


@functools.cache
def option_flags(source: str) -> set[str]:
    """The flags a script declares through the benchmark harness: each keyword of its
    ``parser(...)`` and ``options(...)`` calls (``max_tokens=64``: ``--max-tokens``)."""
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    named = [
        c for c in calls if isinstance(c.func, ast.Name) and c.func.id in ("parser", "options")
    ]
    return {"--" + k.arg.replace("_", "-") for c in named for k in c.keywords if k.arg}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_script_flag_exists(page: Path) -> None:
    """A flag quoted after a script in code is one the script defines: a string literal, or
    a keyword of the harness's ``parser``/``options``."""
    prose, code = split(page.read_text())
    wrong = []
    for text in [span for line in prose for span in CODE_SPAN.findall(line)] + code:
        for m in SCRIPT.finditer(text):
            script = ROOT / m[0]
            if not script.is_file() or script.suffix != ".py":
                continue
            source = script.read_text()
            rest = re.split(r"\s#|[|;&]", text[m.end() :])[0]
            known = option_flags(source)
            flags = [f for f in FLAG.findall(rest) if f'"{f}"' not in source and f not in known]
            wrong += [f"{m[0]} {f}" for f in flags]
    assert not wrong, f"{page.name} quotes flags its scripts do not define: {sorted(set(wrong))}"
