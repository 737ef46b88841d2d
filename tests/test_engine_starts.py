"""While an engine starts, the progress says so, with the last start's seconds on this machine
(``engines/starts.py``, ``LiveProgress.starting``); no engine here (``test_observe_run`` shows
the line from a real start)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from batchspec.engines.starts import remember_start, starting_line, starts_file
from batchspec.io.layout import OutDir
from batchspec.spec.tree import TREE, VLLM
from batchspec.work.live import LiveProgress

MODEL = "builtin:smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BATCHSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_line_gives_the_last_start_of_that_engine_and_model(cache: Path) -> None:
    assert starting_line(VLLM, MODEL) == "starting the engine (vLLM)"  # never measured
    remember_start(VLLM, MODEL, 19.6)
    assert starts_file() == cache / "profiles" / "starts.json"
    assert starting_line(VLLM, MODEL) == "starting the engine (vLLM, ~20 s last time)"
    assert starting_line(VLLM, "/models/other") == "starting the engine (vLLM)"
    assert starting_line(TREE, MODEL) == "starting the engine (tree engine)"
    remember_start(VLLM, MODEL, 57.2)  # the last start counts, not the first
    assert starting_line(VLLM, MODEL) == "starting the engine (vLLM, ~57 s last time)"


def test_a_damaged_cache_costs_only_the_estimate(cache: Path) -> None:
    starts_file().parent.mkdir(parents=True)
    starts_file().write_text("[1, 2")
    assert starting_line(VLLM, MODEL) == "starting the engine (vLLM)"
    remember_start(VLLM, MODEL, 3.0)
    assert starting_line(VLLM, MODEL) == "starting the engine (vLLM, ~3 s last time)"


def drawn(stream: io.StringIO) -> str:
    """The bar as last drawn (tqdm redraws it after a carriage return)."""
    return [line for line in re.split(r"[\r\n]", stream.getvalue()) if " rows" in line][-1]


def test_the_bar_says_what_it_waits_for_then_generating(tmp_path: Path) -> None:
    stream = io.StringIO()
    live = LiveProgress(None, OutDir(tmp_path / "out"), 4, 0, "bar", stream=stream)
    live.start()
    with live.starting("starting the engine (vLLM, ~20 s last time)"):
        live.refresh()
        assert drawn(stream).startswith("starting the engine (vLLM, ~20 s last time):")
        assert "0/4 rows" in drawn(stream)
    live.refresh()
    assert drawn(stream).startswith("generating:"), drawn(stream)
    live.close()


def test_log_lines_say_it_at_once_and_while_it_lasts(tmp_path: Path) -> None:
    stream = io.StringIO()
    live = LiveProgress(None, OutDir(tmp_path / "out"), 4, 0, "log", stream=stream)
    with live.starting("starting the engine (tree engine)"):
        assert stream.getvalue() == "progress: starting the engine (tree engine)\n"
        assert live.summary().endswith(", starting the engine (tree engine)")
    assert "starting" not in live.summary()
