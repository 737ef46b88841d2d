"""The job-spec reference, generated from the spec's own field descriptions.

The job-spec reference (``docs/spec.md``) is this module's output, between two markers, so a
key's documentation lives in one place (its ``Field`` in its section's module) and a test fails
when the page and the code disagree. Regenerate after changing a field::

    python -m batchspec.spec.docs --write docs/spec.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from batchspec.spec.job import JobSpec
from batchspec.spec.keys import OUTPUT_NEUTRAL

BEGIN = (
    "<!-- spec-reference: generated from batchspec/spec/ by "
    "`python -m batchspec.spec.docs --write docs/spec.md` -->"
)
END = "<!-- /spec-reference -->"
PAGES = {
    "Choosing K": "choosing-k.md",
    "Draft trees": "trees.md",
    "Routing a job to the faster engine": "choosing-k.md#routing-a-job-to-the-faster-engine",
    "Inputs and outputs": "inputs-outputs.md",
}
"""Pages of ``docs/`` that field descriptions point to as ``*Title*``: linked in the reference,
so a description stays plain text in its module and a link on the page."""


def _default(info: FieldInfo) -> str:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "shown_default" in extra:
        return str(extra["shown_default"])
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]
    if value is None or value is PydanticUndefined:
        return "none"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _section_of(info: FieldInfo) -> type[BaseModel] | None:
    typ = info.annotation
    return typ if isinstance(typ, type) and issubclass(typ, BaseModel) else None


def _optional_section(info: FieldInfo) -> type[BaseModel] | None:
    """The section inside ``X | None`` (a nested, optional section such as ``speculative.tree``)."""
    for arg in get_args(info.annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _nested(name: str, fields: dict[str, FieldInfo]) -> list[str]:
    """A sub-table for each optional section inside a section."""
    out: list[str] = []
    for key, info in fields.items():
        sub = _optional_section(info)
        if sub is not None:
            doc = " ".join((sub.__doc__ or "").split())
            out += [f"### `{name}.{key}`", "", doc, ""]
            out += _table(
                [(k, _default(f), f.description or "") for k, f in sub.model_fields.items()]
            )
            out += [""]
    return out


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{key}` | {default} | {meaning} |" for key, default, meaning in rows]
    return lines


def _neutral_note(section: str, keys: list[str]) -> list[str]:
    """Which keys of a section an output directory is not bound to (``OUTPUT_NEUTRAL``)."""
    if section in OUTPUT_NEUTRAL:
        return ["", "None of these keys is in the spec hash: change them between runs freely."]
    free = [k for k in keys if (f"{section}.{k}" if section else k) in OUTPUT_NEUTRAL]
    if not free:
        return []
    shown = ", ".join(f"`{k}`" for k in free)
    return ["", f"Not in the spec hash (where or how fast, not which rows): {shown}."]


def reference() -> str:
    """The job-spec reference in Markdown: one table per section, plus the top-level keys."""
    out: list[str] = []
    top: list[tuple[str, str, str]] = []
    for name, info in JobSpec.model_fields.items():
        if info.exclude:
            continue
        section = _section_of(info)
        if section is None:
            top.append((name, _default(info), info.description or ""))
            continue
        doc = " ".join((section.__doc__ or "").split())
        out += [f"## `{name}`", "", doc, ""]
        fields = section.model_fields
        out += _table([(k, _default(f), f.description or "") for k, f in fields.items()])
        out += [*_neutral_note(name, list(fields)), "", *_nested(name, fields)]
    out += ["## top level", "", *_table(top), *_neutral_note("", [t[0] for t in top])]
    return _link("\n".join(out).replace("\n\n\n", "\n\n").rstrip() + "\n")


def _link(text: str) -> str:
    """``*Title*`` of a page in ``PAGES`` as a Markdown link to it; other emphasis stays."""

    def repl(m: re.Match[str]) -> str:
        page = PAGES.get(m[1])
        return f"[{m[1]}]({page})" if page else m[0]

    return re.sub(r"\*([A-Z][^*\n]*)\*", repl, text)


def splice(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n\n" + block + "\n" + text[end:]


def written_block(text: str) -> str:
    """What a page (``docs/spec.md``) holds between the markers now."""
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="splice the reference into this Markdown file")
    args = ap.parse_args(argv)
    if args.write is None:
        sys.stdout.write(reference())
        return 0
    args.write.write_text(splice(args.write.read_text(), reference()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
