"""Committed outputs read into an engine that drafts from the job's outputs (suffix drafts).

The tree engine's suffix drafts index each domain's finished outputs, but only those its own
rows produced: after a resume or a restart, and on a second worker or Slurm array task, its
index would start empty beside thousands of committed rows of the same domain. So when an
engine meets a domain's first unit, the worker reads the newest of that domain's committed
outputs (``io/recent.py``, ``speculative.suffix.read_tokens`` within the index's capacity),
tokenizes them with the job's tokenizer (the engine's: parts keep text only) and hands them
to the engine (``base.LearnsOutputs``), oldest first, before the unit's rows start.

The same token ids go to the replay (``feeding.Replays``), so a row replays against the index
it drafted from: seeded before any row of the domain, as in the engine. Retokenized text is
not always the engine's own tokens (a detokenized output may tokenize otherwise, and its end
token is not in the text): that changes what the seeded rows propose, never a row's output
(drafts are verified), and not the replay's exactness (it learns the same ids).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from batchspec.engines import Engine, UnitSource
from batchspec.engines.base import LearnsOutputs
from batchspec.io.layout import OutDir
from batchspec.io.recent import parts_by_unit, recent_outputs
from batchspec.spec import JobSpec
from batchspec.spec.suffix import SuffixSpec
from batchspec.units import UnitRequests, WorkUnit
from batchspec.work.feeding import Replays

CHUNK_ROWS = 256
"""Outputs tokenized at once: the token lists of one chunk are all that is held beside the
index (a million tokens as Python lists would be ~40 MB)."""


class Seeding:
    """Reads each domain's committed outputs into the engine once, at its first unit there."""

    def __init__(
        self, spec: JobSpec, units: list[WorkUnit], tokenizer: Any, replays: Replays
    ) -> None:
        self.out = OutDir(spec.output_dir)
        self.settings = spec.speculative.suffix or SuffixSpec()
        self.tokenizer, self.replays = tokenizer, replays
        self.units: dict[str | None, set[str]] = {}
        for u in units:
            self.units.setdefault(u.domain, set()).add(u.unit_id)
        self.budget = min(self.settings.read_tokens, self.settings.max_tokens)
        self.engine: LearnsOutputs | None = None
        self.seeded: set[str | None] = set()
        self.parts: dict[str, Path] | None = None
        """The committed parts by unit, listed once per engine (a listing of a 10M-row job's
        output is ~40,000 names: once, not once per domain)."""
        self.rows = self.tokens = 0
        self.seconds = 0.0

    def engine_up(self, engine: Engine) -> None:
        """A new engine (its index empty): every domain is read again at its first unit."""
        learns = isinstance(engine, LearnsOutputs) and engine.learns_outputs
        self.engine = engine if learns and self.budget > 0 else None
        self.seeded, self.parts = set(), None

    def before(self, requests: UnitRequests | None) -> None:
        """Read the unit's domain into the engine unless done already for this engine."""
        if requests is None or self.engine is None or requests.unit.domain in self.seeded:
            return
        started = time.perf_counter()
        domain = requests.unit.domain
        self.seeded.add(domain)
        if self.parts is None:
            self.parts = parts_by_unit(self.out)
        units = self.units.get(domain, set())
        found = recent_outputs([self.parts[u] for u in units if u in self.parts], self.budget)
        for i in range(0, len(found.texts), CHUNK_ROWS):
            chunk = found.texts[i : i + CHUNK_ROWS]
            ids = self.tokenizer(chunk, add_special_tokens=False)["input_ids"]
            self.engine.learn_outputs(domain, ids)
            self.replays.learn(domain, ids)
            self.tokens += sum(map(len, ids))
        self.rows += len(found.texts)
        self.seconds += time.perf_counter() - started

    def mark(self) -> tuple[int, int, float]:
        return self.rows, self.tokens, self.seconds

    def since(self, mark: tuple[int, int, float]) -> dict[str, Any]:
        """An engine record's fields (the run log): what was read in since ``mark``."""
        rows, tokens, seconds = mark
        return {
            "seeded_rows": self.rows - rows,
            "seeded_tokens": self.tokens - tokens,
            "seed_s": round(self.seconds - seconds, 3),
        }


class SeedingFeed:
    """An engine's feed that seeds each unit's domain before the engine sees the unit."""

    def __init__(self, feed: UnitSource, seeding: Seeding) -> None:
        self.feed, self.seeding = feed, seeding

    def next_unit(self) -> UnitRequests | None:
        requests = self.feed.next_unit()
        self.seeding.before(requests)
        return requests

    def exhausted(self) -> bool:
        return self.feed.exhausted()

    def wait(self) -> None:
        self.feed.wait()
