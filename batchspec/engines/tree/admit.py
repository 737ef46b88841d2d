"""How rows join the tree engine's batch: a unit opened into rows waiting for a slot, and a
row's prompt put into its slot, computed or copied from a row in flight with the same prompt.

A job that asks n samples of a prompt (or repeats a prompt) would otherwise prefill it n
times; the copy costs a slice of the KV cache. Which twin may be copied is a rule of the
drafters': a row that drafts needs the drafter's state of the prompt (an EAGLE head keeps the
target's features of every position), which only a computed prefill, or a drafting twin's,
has; a row at K=0 never made it, nor a row of another drafter (``speculative.drafters``).
"""

from __future__ import annotations

from collections.abc import Callable

from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.rows import TreeRow
from batchspec.units import RowResult, UnitRequests


class OpenUnit:
    """A unit in flight: its results so far and how many rows are still decoding."""

    def __init__(self, unit: UnitRequests):
        self.unit = unit
        self.results: list[RowResult | None] = [None] * len(unit.rows)
        self.left = 0

    def finish(self, index: int, result: RowResult, tokens: int) -> None:
        """Row ``index`` is done with ``result`` (``tokens`` generated: the unit's progress,
        which the worker reads while it runs)."""
        self.results[index] = result
        self.left -= 1
        self.unit.finished += 1
        self.unit.finished_tokens += tokens


def closed(opened: list[OpenUnit]) -> list[OpenUnit]:
    """The units whose rows are all done, taken out of ``opened`` (in order)."""
    done = [e for e in opened if e.left == 0]
    for entry in done:
        opened.remove(entry)
    return done


def open_unit(unit: UnitRequests, k: int, k_cap: int, drafts: bool) -> tuple[OpenUnit, list[int]]:
    """``unit`` opened at K = ``k`` and the indices of its rows to decode (rows with an
    error are results already); a K the engine cannot take is refused before any row starts.
    ``drafts``: whether the engine has a drafter (without one it takes K=0 only)."""
    if not 0 <= k <= k_cap or (k > 0 and not drafts):
        raise ValueError(
            f"unit {unit.unit.unit_id} asks for K={k}; this engine takes 0"
            + (f" to {k_cap}" if drafts else " only")
        )
    entry = OpenUnit(unit)
    waiting = []
    for i, req in enumerate(unit.rows):
        if req.error is not None:
            entry.results[i] = RowResult(req, error=req.error)
        else:
            entry.left += 1
            waiting.append(i)
    return entry, waiting


class Prompts:
    """The rows in flight by prompt, so that a new row may copy a twin's cached prompt."""

    def __init__(self, model: TreeModel, drafts: Callable[[TreeRow], str | None]) -> None:
        """``drafts(row)``: the drafter that keeps ``row``, None for none (the twin rule
        above: a drafting row copies only a twin of its own drafter)."""
        self.model, self.drafts = model, drafts
        self.by_prompt: dict[int, TreeRow] = {}

    def prefill(self, row: TreeRow, prompt: list[int], rows: list[TreeRow]) -> TreeRow | None:
        """The prompt's KV into the row's slot and its last logits in ``row.prefill_logits``;
        the twin among ``rows`` (those in flight) it was copied from, or None if computed."""
        key = hash(tuple(prompt))
        twin = self.by_prompt.get(key)
        same = twin is not None and twin.req.prompt_token_ids == prompt and twin in rows
        mine = self.drafts(row)
        if twin is not None and same and (mine is None or mine == self.drafts(twin)):
            self.model.share_prefix(twin.slot, row.slot, len(prompt))
            row.prefill_logits = twin.prefill_logits
            return twin
        row.prefill_logits = self.model.prefill(row.slot, prompt)
        self.by_prompt[key] = row
        return None

    def forget(self, row: TreeRow) -> None:
        """``row`` finished: a later row with its prompt computes it or copies another twin."""
        key = hash(tuple(row.req.prompt_token_ids or []))
        if self.by_prompt.get(key) is row:
            del self.by_prompt[key]
