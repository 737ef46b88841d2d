"""The ``status`` examples quoted in the README and docs/operations.md, as line shapes: what
a test compares with what ``status`` prints, so that an example cannot drift from the product
(a line added, renamed or reordered in ``observe/status.py`` fails a test until the docs
follow). A shape keeps a line's words and punctuation and drops what differs between runs:
numbers, paths, unit ids, worker and domain names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "operations.md"]


def status_examples() -> list[list[str]]:
    """Every fenced block of the pages that shows ``status`` output: its lines, without the
    command line that introduces it, ``...`` lines or trailing comments."""
    blocks = []
    for page in PAGES:
        for block in fenced(page.read_text()):
            lines = [line for line in block if not line.startswith("$ ")]
            if lines and re.match(r"\S+: (running|complete|stopped)$", lines[0]):
                blocks.append([line for line in lines if line.strip() != "..."])
    return blocks


def fenced(text: str) -> list[list[str]]:
    """The lines of each fenced code block of a Markdown text."""
    blocks: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
    return blocks


def shape(line: str) -> str:
    """``line`` with what differs between runs replaced by placeholders."""
    line = re.sub(r"^\S+: (?=running|complete|stopped)", "OUT: ", line)
    line = re.sub(r"^  lease \S+: \S+ ", "  lease UNIT: WORKER ", line)
    line = re.sub(r"^  (worker|domain) \S+: ", r"  \1 NAME: ", line)
    line = re.sub(r"ETA -$", "ETA 0 min", line).replace("*", "")  # no ETA while nothing moves
    line = re.sub(r"\b1 unit\b", "1 units", line)  # singular or plural, one shape
    line = re.sub(r"\d+(\.\d+)?(,\d+)*", "N", line)
    return re.sub(r"(?<= )-(?=[ ;,]|$)", "N", line)  # a rate not known yet


def shapes(lines: list[str]) -> dict[str, set[str]]:
    """Shapes by the kind of line (its first word, or ``state``), for comparing kinds that
    both texts hold."""
    kinds: dict[str, set[str]] = {}
    for line in lines:
        s = shape(line)
        kind = "state" if s.startswith("OUT: ") else s.split()[0]
        kinds.setdefault(kind, set()).add(s)
    return kinds
