"""The package's shape: data flows one way between its folders, and pieces stay readable."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "batchspec"
FIRST = ["spec"]
"""Folders of the first layer, beside the top-level modules (units, errors, models): the job spec
and plain data, which every later layer reads and which import from no later layer."""
LAYERS = ["io", "engines", "speculation", "measure", "work", "cluster|observe", "cli"]
"""Folders in the order data flows; the first layer (``FIRST``, the top-level modules) comes first.
A module may import its own layer and the ones before it, never a later one. ``measure``
(``tune``, ``verify``) drives engines and uses the K model, so it comes after them; a run never
needs it (it reads what ``tune`` measured through ``speculation.tuning``) and it needs nothing
of a run's claiming or writing, so it comes before ``work``, which may then not import it."""


def layer(module: str) -> int:
    """0 for top-level modules and FIRST, then 1.. for the folders in LAYERS order."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return len(LAYERS) + 1
    if len(parts) > 1 and parts[1] in FIRST:
        return 0
    for i, names in enumerate(LAYERS, 1):
        if parts[1] in names.split("|"):
            return i
    folder = PACKAGE / parts[1]
    assert not folder.is_dir(), f"{module}: folder {parts[1]!r} has no layer; add it to LAYERS"
    return 0


def modules() -> dict[str, tuple[int, ast.Module]]:
    """Module name -> (lines, syntax tree), for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        text = path.read_text()
        found[name.removesuffix(".__init__")] = (len(text.splitlines()), ast.parse(text))
    return found


def test_imports_flow_one_way() -> None:
    wrong = []
    for name, (_, tree) in modules().items():
        for node in ast.walk(tree):
            target = node.module or "" if isinstance(node, ast.ImportFrom) else ""
            if target.startswith("batchspec.") and layer(target) > layer(name):
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_modules_and_functions_stay_short() -> None:
    long = []
    for name, (lines, tree) in modules().items():
        if lines > 350:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = node.end_lineno - node.lineno + 1
                if size > 60:
                    long.append(f"{name}.{node.name}: {size} lines")
    assert not long, long
