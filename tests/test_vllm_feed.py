"""vLLM's feed (``engines.vllm_engine.VllmEngine.run``) in the order of its steps, against a
stand-in for vLLM's ``LLMEngine`` that finishes one request a step: what the loop hands over
and when it takes the next unit. That real vLLM runs the loop is ``test_e2e.py``'s."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from support.feeds import Watched, one_row_units

from batchspec.engines.vllm_engine import VllmEngine
from batchspec.units import RowRequest


class OneAStep:
    """vLLM's engine as the loop sees it: requests in, one finished request out a step."""

    def __init__(self) -> None:
        self.queue: deque[tuple[str, RowRequest]] = deque()

    def get_num_unfinished_requests(self) -> int:
        return len(self.queue)

    def step(self) -> list[Any]:
        request_id, req = self.queue.popleft()
        done = SimpleNamespace(text="", token_ids=[1], finish_reason="length", logprobs=None)
        out = SimpleNamespace(
            request_id=request_id, finished=True, outputs=[done], metrics=None,
            prompt_token_ids=req.prompt_token_ids, prompt_logprobs=None,
        )  # fmt: skip
        return [out]


def feed(slots: int, units: int) -> Watched:
    """A ``VllmEngine`` at K=0 with ``slots`` requests at a time, without vLLM behind it
    (only the attributes its loop reads), run over ``units`` one-row units."""
    eng = VllmEngine.__new__(VllmEngine)
    core = OneAStep()
    eng.engine, eng.k, eng.k_per_unit, eng.low_water = core, 0, False, slots
    eng.procs, eng._poisoned, eng._steps, eng._next_id = [], False, 0, 0
    eng._stalled, eng._step_since = False, None
    eng.submit = lambda request_id, req, k: core.queue.append((request_id, req))
    got: list[Any] = []
    source = Watched(one_row_units([[5, 6, 7]] * units), got)
    for res in eng.run(source, lambda: False):
        got.append(res)
    assert len(got) == units
    return source


def test_a_finished_unit_is_handed_over_before_the_next_is_taken() -> None:
    """The next unit's K is chosen knowing the units the last step finished: with two slots,
    the third unit is taken after the first reached the consumer, the fourth after the
    second. Taking before handing over gives [0, 0, 0, 1, 2]."""
    assert feed(slots=2, units=5).held_at_take == [0, 0, 1, 2, 3]
