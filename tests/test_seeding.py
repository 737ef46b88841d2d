"""Suffix drafts seeded from committed parts (``io/recent.py``, ``work/seeding.py``): what is
read back (the newest outputs of the domain's units, within the index's capacity, two
columns), what the engine and the replay learn from it, and, on the cycle model, a seeded
engine's first rows drafting from it with rows unchanged and replay equal to its counts."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import job_dict
from test_replay import tree_replayer
from test_tree_loop import SUFFIX, counts, cycle_model, engine, random_prompts, run, same_rows

from batchspec.io.layout import OutDir
from batchspec.io.recent import parts_by_unit, recent_outputs
from batchspec.spec import JobSpec
from batchspec.units import UnitRequests, WorkUnit
from batchspec.work.seeding import Seeding


def commit(out: OutDir, unit_id: str, rows: list[tuple[str | None, int | None]], age: int) -> None:
    """A part of (text, num_output_tokens) rows, committed ``age`` seconds ago."""
    out.parts.mkdir(parents=True, exist_ok=True)
    texts, counts_ = zip(*rows, strict=True)
    table = pa.table(
        {
            "generated_text": pa.array(texts, pa.string()),
            "num_output_tokens": pa.array(counts_, pa.int32()),
            "prompt": pa.array(["p" * 1000] * len(rows)),  # never read
        }
    )
    pq.write_table(table, out.part(unit_id))
    os.utime(out.part(unit_id), (1e9 - age, 1e9 - age))


def parts_of(out: OutDir, *unit_ids: str) -> list[Path]:
    parts = parts_by_unit(out)
    return [parts[u] for u in unit_ids]


def test_the_newest_outputs_within_the_budget_oldest_first(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    commit(out, "u1", [("a", 3), ("b", 3)], age=30)
    commit(out, "u2", [("c", 3), (None, None), ("d", 3)], age=20)  # an error row
    commit(out, "u3", [("e", 3), ("f", 3)], age=10)
    commit(out, "other", [("x", 3)], age=0)  # another domain's unit: never read
    assert set(parts_by_unit(out)) == {"u1", "u2", "u3", "other"}
    found = recent_outputs(parts_of(out, "u3", "u1", "u2"), max_tokens=13)
    # 4 positions a row (3 tokens and a separator): f, e, d fit; c does not.
    assert found.texts == ["d", "e", "f"]
    assert (found.tokens, found.parts_read, found.parts_seen) == (9, 2, 3)
    everything = recent_outputs(parts_of(out, "u1", "u2", "u3"), max_tokens=1000)
    assert everything.texts == ["a", "b", "c", "d", "e", "f"]
    assert recent_outputs(parts_of(out, "u1"), max_tokens=3).texts == []  # not one row fits
    assert recent_outputs([], max_tokens=1000).parts_read == 0


def test_a_part_is_read_for_two_columns_only(tmp_path: Path, monkeypatch) -> None:
    out = OutDir(tmp_path)
    commit(out, "u1", [("a", 3)], age=0)
    asked: list[list[str]] = []
    real = pq.read_table
    monkeypatch.setattr(
        pq, "read_table", lambda p, columns: asked.append(columns) or real(p, columns=columns)
    )
    recent_outputs(parts_of(out, "u1"), max_tokens=100)
    assert asked == [["generated_text", "num_output_tokens"]]


class Learning:
    """An engine double that records what it learns."""

    learns_outputs = True

    def __init__(self) -> None:
        self.learned: list[tuple[str | None, list[list[int]]]] = []

    def learn_outputs(self, domain: str | None, outputs: list[list[int]]) -> None:
        self.learned.append((domain, outputs))


class Replays:
    def __init__(self) -> None:
        self.learned: list[tuple[str | None, list[list[int]]]] = []

    def learn(self, domain: str | None, outputs: list[list[int]]) -> None:
        self.learned.append((domain, outputs))


def tokenize(texts: list[str], add_special_tokens: bool) -> dict[str, list[list[int]]]:
    return {"input_ids": [[ord(c) for c in t] for t in texts]}


def seeding_of(tmp_path: Path, read_tokens: int = 100) -> tuple[Seeding, list[WorkUnit]]:
    units = [WorkUnit(0, "in", i, i + 1, d, 1, domain_index=j) for i, (j, d) in
             enumerate([(0, "a"), (0, "a"), (1, "b")])]  # fmt: skip
    suffix = {"max_tokens": 100, "read_tokens": read_tokens}
    job = job_dict(tmp_path, speculative={"method": "suffix", "engine": "tree", "suffix": suffix})
    spec = JobSpec.model_validate(job)
    return Seeding(spec, units, tokenize, Replays()), units  # type: ignore[arg-type]


@pytest.mark.parametrize("read_committed", [True, False])
def test_each_domain_is_read_once_per_engine_into_engine_and_replay(
    tmp_path: Path, read_committed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeding, units = seeding_of(tmp_path, 100 if read_committed else 0)
    out = OutDir(tmp_path)
    listings = []
    real = OutDir.part_files
    monkeypatch.setattr(OutDir, "part_files", lambda self: listings.append(1) or real(self))
    commit(out, units[0].unit_id, [("hi", 2), ("yo", 2)], age=5)
    commit(out, units[2].unit_id, [("b", 1)], age=5)
    eng = Learning()
    seeding.engine_up(eng)  # type: ignore[arg-type]
    mark = seeding.mark()
    for u in (units[1], units[1], units[2]):
        seeding.before(UnitRequests(u))
    want = [("a", [[104, 105], [121, 111]]), ("b", [[98]])] if read_committed else []
    assert eng.learned == seeding.replays.learned == want  # type: ignore[attr-defined]
    assert seeding.since(mark)["seeded_tokens"] == (5 if read_committed else 0)
    assert len(listings) == (1 if read_committed else 0)  # one listing for both domains
    seeding.engine_up(Learning())  # type: ignore[arg-type]
    seeding.before(UnitRequests(units[1]))  # a new engine: read again
    assert len(seeding.replays.learned) == (3 if read_committed else 0)  # type: ignore[attr-defined]
    assert len(listings) == (2 if read_committed else 0)


def test_a_domain_is_read_within_read_tokens_not_the_whole_index(tmp_path: Path) -> None:
    seeding, units = seeding_of(tmp_path, read_tokens=3)  # one row of 2 tokens and its end
    commit(OutDir(tmp_path), units[0].unit_id, [("hi", 2), ("yo", 2)], age=5)
    eng = Learning()
    seeding.engine_up(eng)  # type: ignore[arg-type]
    seeding.before(UnitRequests(units[1]))
    assert eng.learned == [("a", [[121, 111]])]  # the newest row only


@pytest.mark.usefixtures("one_thread")  # matrices this small: one thread
def test_a_seeded_engine_drafts_its_first_rows_from_the_seed_and_replays_exactly() -> None:
    """The cycle model (rows share its cycles): an engine seeded with another engine's rows
    (a resumed run's committed parts) drafts from them at its first row, where an engine
    without them has only the row's own trie; rows stay K=0's; a replayer that learned the
    same seed counts what the engine counted, row by row."""
    rows = random_prompts(8, 10, seed=2)
    torch.manual_seed(0)
    model = cycle_model(1, noise=0.1)
    earlier = run(engine(model, 4, SUFFIX, {7}), rows[:4])
    seed = [r.token_ids for r in earlier]
    fresh = run(engine(model, 4, SUFFIX, {7}), rows[4:])
    eng = engine(model, 4, SUFFIX, {7})
    eng.learn_outputs(None, seed)
    seeded = run(eng, rows[4:])
    same_rows(run(engine(model, 0, SUFFIX, {7}), rows[4:]), seeded)
    assert seeded[0].spec.drafted > fresh[0].spec.drafted  # the seed's continuations
    assert sum(r.spec.accepted for r in seeded) > sum(r.spec.accepted for r in fresh)
    replayer = tree_replayer(eng, [4])
    replayer.learn(None, seed)
    assert [replayer.row(r)[0] for r in seeded] == [r.spec.accepted for r in seeded]
    assert [counts(r) for r in seeded] != [counts(r) for r in fresh]
