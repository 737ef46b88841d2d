"""Spec values keep their YAML type (a boolean is no number, a float no integer), and an error
from a ``--set`` names the ``--set``, not the file."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest
from conftest import job_dict, write_job
from pydantic import BaseModel
from test_spec import error_of, load, spec_keys

from batchspec.errors import UserError
from batchspec.spec import JobSpec
from batchspec.spec.file import load_spec
from batchspec.spec.tree import TreeSpec

WRONG: dict[type, list[Any]] = {
    int: [True, "3", 3.0],
    float: [True, "0.5"],
    bool: [1, "yes", "true"],
}
"""Values of another type that lax parsing turned into the field's type (True -> 1)."""


def _plain(typ: Any) -> Any:
    """``X`` of ``X | None``."""
    if isinstance(typ, types.UnionType):
        return next(a for a in typing.get_args(typ) if a is not type(None))
    return typ


def scalar_keys() -> dict[str, tuple[type, Any]]:
    """Every int, float and bool key of the spec (optional ones and the tree's too), with its
    default."""
    found = {}
    for key in spec_keys() + spec_keys(TreeSpec, "speculative.tree."):
        model: type[BaseModel] = JobSpec
        *sections, name = key.split(".")
        for section in sections:
            model = _plain(model.model_fields[section].annotation)
        info = model.model_fields[name]
        typ = _plain(info.annotation)
        if typ in WRONG:
            found[key] = (typ, info.default)
    return found


def test_every_number_and_flag_is_strict(tmp_path: Path) -> None:
    keys = scalar_keys()
    assert {"sampling.max_tokens", "sampling.temperature", "model.enforce_eager"} <= set(keys)
    assert len(keys) >= 20
    for key, (typ, _) in keys.items():
        for value in WRONG[typ]:
            msg = error_of(tmp_path, [f"{key}={value!r}"])  # '3' stays a string in YAML
            assert f"{key}: " in msg and f"(got {value!r})" in msg, (key, value, msg)


def test_an_integer_serves_where_a_float_is_expected(tmp_path: Path) -> None:
    floats = {k: d for k, (t, d) in scalar_keys().items() if t is float}
    assert "sampling.temperature" in floats
    for key, default in floats.items():
        value = int(default) if isinstance(default, float) else 1
        spec = load(tmp_path, [f"{key}={value}"])
        section, _, name = key.rpartition(".")
        got = getattr(getattr(spec, section), name)
        assert got == value and isinstance(got, float), key


def test_set_errors_name_the_set(tmp_path: Path) -> None:
    assert error_of(tmp_path, ["foo.bar=1"]) == "--set foo.bar=1: foo: unknown key"
    msg = error_of(tmp_path, ["sampling.max_tokens=0"], model={"max_model_length": 5})
    assert msg.endswith(
        "job.yaml: model.max_model_length: unknown key; --set sampling.max_tokens=0: "
        "sampling.max_tokens: Input should be greater than or equal to 1 (got 0)"
    ), msg
    # A whole section given by --set, and a rule of a section the file holds, changed by --set.
    msg = error_of(tmp_path, ["speculative.tree={branching: [0]}"])
    assert msg.startswith("--set speculative.tree={branching: [0]}: speculative.tree.branching")
    msg = error_of(tmp_path, ["speculative.engine=vllm", "speculative.tree={}"])
    assert msg.endswith(
        "job.yaml with --set speculative.engine=vllm --set speculative.tree={}: speculative: "
        "speculative.tree is set but speculative.engine is vllm, which drafts chains only: "
        "set engine to tree (or auto), or remove the tree key"
    ), msg
    # The last --set of a key is the one that counts.
    assert (
        load(tmp_path, ["sampling.max_tokens=0", "sampling.max_tokens=5"]).sampling.max_tokens == 5
    )


def test_an_error_of_the_file_names_the_file_though_a_set_came_along(tmp_path: Path) -> None:
    job = job_dict(tmp_path / "out", sampling={"max_tokens": True})
    path = write_job(tmp_path / "job.yaml", job)
    with pytest.raises(UserError) as exc:
        load_spec(path, ["sampling.temperature=0.5"])
    assert str(exc.value).startswith(f"{path}: sampling.max_tokens: ")
