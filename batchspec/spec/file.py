"""Reading a job spec file: YAML, ``--set`` overrides, validation; every failure one line.

Errors name the field path as the user wrote it (``model.max_model_length: unknown key``), the
file, and where YAML broke, the line and column.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from batchspec.errors import UserError
from batchspec.spec.job import JobSpec


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {dotted}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``key.path=value`` with the value read as YAML (so 3 is an int, [a, b] a list)."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"--set {item!r}: empty key")
    try:
        return key, load_yaml(raw, f"--set {item}", tuple(key.split("."))) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = exc.__class__.__name__
        raise UserError(f"--set {key}: value is not valid YAML ({problem})") from None


def load_yaml(text: str, source: str, at: tuple[str, ...] = ()) -> Any:
    """``text`` as YAML (safe types only), refusing a key given twice in one mapping: PyYAML
    keeps the last silently, so a second ``sampling:`` section would replace the first.
    ``at``: the key path the text is the value of (a ``--set``)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _no_repeated_keys(node, source, at, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _no_repeated_keys(node: yaml.Node, source: str, at: tuple[str, ...], seen: set[int]) -> None:
    """A UserError naming the first key given twice at any depth, with both lines. ``seen``:
    nodes already walked (an alias repeats a node; it is checked once)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_repeated_keys(item, source, (*at, str(i)), seen)
    if not isinstance(node, yaml.MappingNode):
        return
    lines: dict[tuple[str, str], int] = {}
    for key, value in node.value:
        name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
        if key.tag != "tag:yaml.org,2002:merge":  # ``<<: *base`` may be overridden by design
            line = key.start_mark.line + 1
            if (key.tag, name) in lines:
                first = lines[key.tag, name]
                said = f"lines {first} and {line}" if first != line else f"both on line {line}"
                raise UserError(
                    f"{source}: {'.'.join((*at, name))}: given twice ({said}); the second "
                    "would silently replace the first"
                )
            lines[key.tag, name] = line
        _no_repeated_keys(value, source, (*at, name), seen)


Override = tuple[tuple[str, ...], str]
"""A ``--set`` item: the key path it sets, and the item as the user typed it."""


def _in_file(data: Any, loc: tuple[Any, ...]) -> bool:
    """Whether the spec file itself holds something at ``loc``."""
    for key in loc:
        in_dict = isinstance(data, dict) and key in data
        if not (in_dict or (isinstance(data, list) and isinstance(key, int) and key < len(data))):
            return False
        data = data[key]
    return True


def _blame(loc: tuple[Any, ...], file_data: dict[str, Any], overrides: list[Override]) -> str:
    """Who gave the value at ``loc``: the ``--set`` items at, above or below it (``--set
    foo.bar=1`` for an unknown ``foo``), with the file named too where they only changed a
    section the file holds; ``""`` for the file alone."""
    where = tuple(str(x) for x in loc)
    hits, whole = [], False
    for keys, item in reversed(overrides):
        n = min(len(keys), len(where))
        if where and keys[:n] == where[:n]:
            hits.insert(0, f"--set {item}")
            whole = len(keys) <= len(where)
            if whole:
                break  # it set the whole value: earlier items are gone
    if not hits:
        return ""
    given = " ".join(hits)
    return given if whole or not _in_file(file_data, loc) else f"with {given}"


def format_validation_error(
    exc: ValidationError,
    source: str,
    file_data: dict[str, Any] | None = None,
    overrides: list[Override] | None = None,
) -> str:
    """One line, field path first, the way a user would look it up; each problem blamed on
    the file ``source`` or on the ``--set`` that gave the value."""
    parts, last = [], None
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        msg = msg.removeprefix("Value error, ")
        if "input" in err and err["type"] not in ("missing", "extra_forbidden"):
            shown = repr(err["input"])
            if len(shown) <= 60:
                msg += f" (got {shown})"
        blame = _blame(err["loc"], file_data or {}, overrides or [])
        origin = blame if blame.startswith("--set") else f"{source} {blame}".strip()
        said = f"{loc}: {msg}" if loc else msg  # a rule across sections names its keys
        parts.append(said if origin == last else f"{origin}: {said}")
        last = origin
    return "; ".join(parts)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Read, override and validate a job spec; every failure is a one-line UserError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read job spec ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} "
            "is not UTF-8); a job spec is YAML"
        ) from None
    try:
        data = load_yaml(text, str(path))
    except yaml.reader.ReaderError as exc:
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise UserError(
            f"{path}: not a text file (control character {code:#04x} at offset {exc.position});"
            " a job spec is YAML"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a job spec is a YAML mapping with input, output and model")
    file_data = copy.deepcopy(data)
    given: list[Override] = []
    for item in overrides:
        key, value = parse_override(item)
        _set_path(data, key, value)
        given.append((tuple(key.split(".")), item))
    data.pop("base_dir", None)
    try:
        return JobSpec(**data, base_dir=str(path.resolve().parent))
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, str(path), file_data, given)) from None
    except TypeError as exc:
        raise UserError(f"{path}: {exc}") from None
