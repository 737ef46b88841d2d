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
from batchspec.spec import JobSpec


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
        return key, yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = exc.__class__.__name__
        raise UserError(f"--set {key}: value is not valid YAML ({problem})") from None


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
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
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
        parts.append(f"{loc}: {msg}" if origin == last else f"{origin}: {loc}: {msg}")
        last = origin
    return "; ".join(parts)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Read, override and validate a job spec; every failure is a one-line UserError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read job spec ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
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
