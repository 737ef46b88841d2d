"""How long an engine took to start on this machine, remembered for the next start.

An engine start is a run's longest silence (57 s of an 83 s run of the default job on this
2-core CPU): no row moves while vLLM imports and loads. So the progress bar and the progress
lines say what the run waits for, and about how long it took last time: the last measured
start of the same engine and model on this host, kept in the user's cache beside the step
profiles (``$BATCHSPEC_CACHE``, else ``$BATCHSPEC_HOME``, else ``~/.cache/batchspec``; under
``profiles/starts.json``). Nothing here imports an inference stack: the line is shown before
the engine's imports begin.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

from batchspec.io.temps import temp_name
from batchspec.models import user_cache
from batchspec.spec.tree import TREE, VLLM

SHOWN = {VLLM: "vLLM", TREE: "tree engine"}
"""The engines' names as the progress line says them."""


def starts_file() -> Path:
    """``profiles/starts.json`` in the user's cache, where the step profiles are kept."""
    return user_cache() / "profiles" / "starts.json"


def _key(engine: str, model: str) -> str:
    """Per host (a cache shared over a cluster's filesystem serves several) and model (a
    start is mostly loading it)."""
    return f"{socket.gethostname()} {engine} {model}"


def _read() -> dict[str, float]:
    try:
        data = json.loads(starts_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def last_start(engine: str, model: str) -> float | None:
    """Seconds the last start of ``engine`` with ``model`` took here; None if never measured."""
    seconds = _read().get(_key(engine, model))
    return float(seconds) if isinstance(seconds, int | float) else None


def remember_start(engine: str, model: str, seconds: float) -> None:
    """Keep this start's seconds for the next one (atomic rewrite; two workers writing at
    once lose one of their figures, which the next start measures again). A cache that
    cannot be written costs only the estimate."""
    path = starts_file()
    data = _read()
    data[_key(engine, model)] = round(seconds, 1)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(path)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)


def starting_line(engine: str, model: str) -> str:
    """``starting the engine (vLLM, ~20 s last time)``; without the estimate when unknown."""
    last = last_start(engine, model)
    when = f", ~{last:.0f} s last time" if last is not None else ""
    return f"starting the engine ({SHOWN.get(engine, engine)}{when})"
