"""Reading a job spec file: YAML, ``--set`` overrides, validation; every failure one line.

Errors name the field path as the user wrote it (``model.max_model_length: unknown key``), the
file, and where YAML broke, the line and column.
"""

from __future__ import annotations

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


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, field path first, the way a user would look it up."""
    parts = []
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
        parts.append(f"{loc}: {msg}")
    return f"{source}: " + "; ".join(parts)


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
    for item in overrides:
        key, value = parse_override(item)
        _set_path(data, key, value)
    data.pop("base_dir", None)
    try:
        return JobSpec(**data, base_dir=str(path.resolve().parent))
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, str(path))) from None
    except TypeError as exc:
        raise UserError(f"{path}: {exc}") from None
