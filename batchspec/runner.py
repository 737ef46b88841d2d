"""The worker loop: claim units, generate, commit, release; survive engine deaths and signals.

Data flows one way: spec -> preflight (checks, plan) -> claim (lease) -> prompt builder ->
engine -> writer (atomic part) -> release. Everything another worker or a later run needs lives
in the output directory (manifest, leases, parts, failure records), so any number of workers,
started anywhere at any time, pick up exactly the units that have no part yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from batchspec.checks import Preflight, preflight
from batchspec.claims import ClaimingSource, FailureLog
from batchspec.controller import KPolicy, Observation
from batchspec.engine import Engine, EngineFailure, UnitResult
from batchspec.inputs import PromptBuilder
from batchspec.leases import Leases
from batchspec.manifest import claim_output_dir, make_manifest
from batchspec.planner import WorkUnit
from batchspec.spec import JobSpec
from batchspec.writer import (
    commit_part,
    committed_units,
    error_positions,
    output_schema,
    part_path,
    replace_part,
    unit_table,
)

RUNS_DIR = "runs"
RUN_ID_ENV = "BATCHSPEC_RUN_ID"
WORKER_ENV = "BATCHSPEC_WORKER_INDEX"


def run_id() -> str:
    """Identity of one invocation (all its workers): failed units are skipped within it only.

    The launcher passes its own to its workers; a Slurm array's tasks share the array job's;
    otherwise one is made and kept in the environment, so it holds for the whole process.
    """
    if not os.environ.get(RUN_ID_ENV):
        slurm = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
        os.environ[RUN_ID_ENV] = f"slurm-{slurm}" if slurm else uuid.uuid4().hex[:12]
    return os.environ[RUN_ID_ENV]


def worker_name() -> str:
    parts = [socket.gethostname(), str(os.getpid())]
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        parts.append(f"t{os.environ['SLURM_ARRAY_TASK_ID']}")
    if os.environ.get(WORKER_ENV):
        parts.append(f"w{os.environ[WORKER_ENV]}")
    return "-".join(parts)


@dataclass
class RunStats:
    """What one worker invocation did (the whole run's state is in the output directory)."""

    out_dir: str
    run_id: str
    worker: str
    units_total: int
    units_skipped: int = 0
    units_committed: int = 0
    units_discarded: int = 0
    units_failed: int = 0
    units_abandoned: int = 0
    engine_failures: int = 0
    rows: int = 0
    error_rows: int = 0
    output_tokens: int = 0
    engine_build_s: float = 0.0
    engine_close_s: float = 0.0
    generate_s: float = 0.0
    wall_s: float = 0.0
    stopped_by_signal: bool = False
    engine_builds: int = 0
    engines: list[dict[str, Any]] = field(default_factory=list)
    """One record per stretch of work on one engine (an engine may serve several groups)."""

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.generate_s if self.generate_s > 0 else None


class StopFlag:
    """Set by SIGTERM/SIGINT: stop claiming, finish or abandon in-flight units by a deadline."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.deadline: float | None = None
        self.signal: int | None = None
        self.tripped = threading.Event()
        """Set with the deadline: wakes threads that act on a stop (not the signal handler)."""

    def trip(self, signum: int, _frame: object = None) -> None:
        if self.deadline is None:
            self.signal = signum
            self.deadline = time.monotonic() + self.grace_s
            self.tripped.set()

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGTERM/SIGINT while inside (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self.trip) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def load_tokenizer(pre: Preflight, spec: JobSpec) -> Any:
    from transformers import AutoTokenizer

    path = spec.resolve(spec.model.tokenizer) if spec.model.tokenizer else pre.target_dir
    return AutoTokenizer.from_pretrained(str(path))


class Remaining:
    """The units a worker may still run: one queue per domain in plan order, rows left per
    domain (kept as units are taken, so planning per unit stays cheap on huge plans)."""

    def __init__(self, units: list[WorkUnit]):
        self.queues: dict[str | None, deque[tuple[int, WorkUnit]]] = {}
        for i, u in enumerate(units):
            self.queues.setdefault(u.domain, deque()).append((i, u))
        self.rows = {d: sum(u.num_rows for _, u in q) for d, q in self.queues.items()}
        """Rows left per domain; only domains with units left."""

    def __bool__(self) -> bool:
        return bool(self.queues)

    def first(self, domains: list[str | None]) -> str | None:
        """Of these domains, the one whose next unit comes first in the plan."""
        heads = [(self.queues[d][0][0], i) for i, d in enumerate(domains)]
        return domains[min(heads)[1]] if heads else None

    def pop(self, domain: str | None) -> WorkUnit:
        _, unit = self.queues[domain].popleft()
        self.rows[domain] -= unit.num_rows
        if not self.queues[domain]:
            del self.queues[domain], self.rows[domain]
        return unit


class Worker:
    """One worker of a run: every unit of the plan that it can claim, K group by K group."""

    def __init__(self, spec: JobSpec, pre: Preflight, progress: bool):
        self.spec = spec
        self.pre = pre
        self.out_dir = spec.output_dir
        self.run_id = run_id()
        ex = spec.execution
        self.leases = Leases(self.out_dir, worker_name(), ex.lease_timeout_s, ex.heartbeat_s)
        self.failures = FailureLog(self.out_dir, self.run_id)
        self.stop = StopFlag(ex.shutdown_grace_s)
        types = pre.column_types
        self.schema = output_schema(
            types[spec.input.id_column], {c: types[c] for c in spec.input.passthrough_columns}
        )
        self.tokenizer = load_tokenizer(pre, spec)
        self.attempts: dict[str, int] = {}
        self.progress = progress
        self.policy = KPolicy(spec, self.out_dir, self.leases.me.worker)

    def run(self, todo: list[WorkUnit], stats: RunStats, error_rows: set[str]) -> None:
        bar = tqdm(
            total=sum(u.num_rows for u in todo),
            unit="row",
            disable=not self.progress,
            dynamic_ncols=True,
            desc="generating",
        )
        self.leases.start()
        self._source: ClaimingSource | None = None
        threading.Thread(target=self._on_stop, name="stop-release", daemon=True).start()
        engine: Engine | None = None
        self.remaining = Remaining(todo)
        try:
            with self.stop.installed():
                while self.remaining and not self.stop.stopping:
                    k, first = self._next_group(engine)
                    if engine is not None and engine.k != k:
                        self._close(engine, stats)
                        engine = None
                    engine = self._run_group(k, first, stats, bar, error_rows, engine)
        finally:
            if engine is not None:
                self._close(engine, stats)
            self.leases.stop()
            self.leases.release_all()
            bar.close()
            stats.stopped_by_signal = self.stop.stopping

    def _on_stop(self) -> None:
        """On a stop, hand back at once what the engine has not started (other workers may
        be about to finish, and would otherwise leave those units to the next run)."""
        self.stop.tripped.wait()
        if self._source is not None:
            self._source.release_unstarted()

    def _plan(self, engine_k: int | None) -> dict[str | None, int]:
        """The policy's K per domain for the units left, re-made from the latest
        measurements (this worker's and the others')."""
        self.policy.refresh()
        return self.policy.plan(self.remaining.rows, engine_k)

    def _take(self, k: int, k_of: dict[str | None, int]) -> list[WorkUnit]:
        """The next unit to run at K (in plan order): planned there, or riding along to
        measure K for its domain."""
        rows = self.remaining.rows
        planned = [d for d in rows if k_of[d] == k]
        riding = [d for d in rows if k_of[d] != k and self.policy.explores(d, k_of[d], k)]
        domain = self.remaining.first(planned + riding)
        if domain is None:
            return []
        self.policy.taken(domain, explored=k_of[domain] != k)
        return [self.remaining.pop(domain)]

    def _next_group(self, engine: Engine | None) -> tuple[int, list[WorkUnit]]:
        """The K of the next engine and its first unit.

        The current engine's K if the plan still runs units there, otherwise the planned K
        with the most rows left; where much work is left and a neighbouring K was never
        measured, first a single unit there (``KPolicy.probe``).
        """
        k_of = self._plan(None if engine is None else engine.k)
        probe = self.policy.probe(self.remaining.rows, k_of)
        if probe is not None:
            domain, k = probe
            self.policy.taken(domain, explored=True)
            return k, [self.remaining.pop(domain)]
        rows_by_k: dict[int, int] = {}
        for d, n in self.remaining.rows.items():
            rows_by_k[k_of[d]] = rows_by_k.get(k_of[d], 0) + n
        if engine is not None and engine.k in rows_by_k:
            k = engine.k
        else:
            k = max(rows_by_k, key=lambda x: (rows_by_k[x], -x))
        return k, self._take(k, k_of)

    def _more(self, k: int) -> list[WorkUnit]:
        """Asked by the engine's source whenever it needs a unit: K is decided per unit, and
        the engine's batch stays full as long as the plan keeps running units at K."""
        if not self.remaining:
            return []
        k_of = self._plan(k)
        probe = self.policy.probe(self.remaining.rows, k_of)
        if probe is not None and probe[1] != k:
            return []
        return self._take(k, k_of)

    def _linger_s(self) -> float:
        """Waiting on units other workers hold only pays once nothing else is left."""
        return 0.0 if self.remaining else self.spec.execution.linger_s

    def _close(self, engine: Engine, stats: RunStats) -> None:
        started = time.perf_counter()
        engine.close()
        stats.engine_close_s += time.perf_counter() - started

    def _run_group(
        self,
        k: int,
        units: list[WorkUnit],
        stats: RunStats,
        bar: tqdm,
        error_rows: set[str],
        engine: Engine | None,
    ) -> Engine | None:
        """Units at one K, as long as the plan keeps giving them; returns the engine, still
        up for the next group.

        After an engine failure the units in flight go back to the source and a new engine
        is built, until they commit or run out of attempts.
        """
        source = ClaimingSource(
            units,
            self.out_dir,
            self.leases,
            self.failures,
            self.stop,
            more=lambda: self._more(k),
            linger_s=self._linger_s,
        )
        source.error_rows = error_rows
        self._source = source
        self.leases.progress = lambda: {u: r.finished for u, r in list(source.open.items())}
        while not self.stop.stopping:
            if not source.has_work():
                return engine
            if engine is None:
                engine = Engine(self.spec, k)
                self.policy.build_s = engine.build_s
                stats.engine_build_s += engine.build_s
                stats.engine_builds += 1
            source.builder = PromptBuilder(
                self.spec.input, self.tokenizer, engine.max_model_len, self.spec.sampling.seed
            )
            record = {
                "method": engine.method,
                "num_speculative_tokens": k,
                "build_s": round(engine.build_s, 3),
                "units": 0,
                "output_tokens": 0,
            }
            started = time.perf_counter()
            failure = None
            try:
                for result in engine.run(source, self.stop.expired):
                    tokens = self._commit(result, source, stats)
                    record["units"] += 1
                    record["output_tokens"] += tokens
                    bar.update(len(result.results))
            except EngineFailure as exc:
                failure = str(exc)
            finally:
                gen_s = time.perf_counter() - started
                stats.generate_s += gen_s
                record["generate_s"] = round(gen_s, 3)
                stats.engines.append(record)
            if failure is None:
                if source.open:  # aborted at the shutdown deadline: hand the units back
                    stats.units_abandoned += len(source.open)
                    for uid in list(source.open):
                        source.done(uid)
                return engine
            self._close(engine, stats)
            engine = None
            self._after_failure(source, failure, stats)
        return engine

    def _after_failure(self, source: ClaimingSource, error: str, stats: RunStats) -> None:
        """Units in flight when the engine died: retry them, or give up after max attempts."""
        stats.engine_failures += 1
        stats.engines[-1]["failure"] = error
        for uid, requests in list(source.open.items()):
            source.open.pop(uid)
            unit = requests.unit
            if self.stop.stopping:  # the signal may have taken the engine down with it
                stats.units_abandoned += 1
                self.leases.release(uid)
                continue
            self.attempts[uid] = self.attempts.get(uid, 0) + 1
            if self.attempts[uid] >= self.spec.execution.max_unit_attempts:
                self.failures.record(unit, self.attempts[uid], error)
                stats.units_failed += 1
                self.leases.release(uid)
            else:
                source.retry.append(unit)

    def _commit(self, result: UnitResult, source: ClaimingSource, stats: RunStats) -> int:
        unit_id = result.unit_requests.unit.unit_id
        table = unit_table(result, self.schema)
        positions = result.unit_requests.positions
        if positions is not None:
            # A retry of error rows: the new rows take the old ones' places, the rest stays.
            rows = pq.read_table(part_path(self.out_dir, unit_id)).to_pylist()
            for pos, row in zip(positions, table.to_pylist(), strict=True):
                rows[pos] = row
            replace_part(self.out_dir, unit_id, pa.Table.from_pylist(rows, schema=self.schema))
            stats.units_committed += 1
        elif commit_part(self.out_dir, unit_id, table):
            stats.units_committed += 1
            self.failures.clear(unit_id)
        else:
            stats.units_discarded += 1
        source.done(unit_id)
        ob = Observation(result.unit_requests.unit.domain, result.k, self.spec.model.max_num_seqs)
        for row in table.to_pylist():
            ob.add_row(row)
        self.policy.observe(ob)
        tokens = sum(r.num_output_tokens or 0 for r in result.results)
        stats.rows += len(result.results)
        stats.error_rows += sum(r.error is not None for r in result.results)
        stats.output_tokens += tokens
        return tokens


def prepare_run(
    spec: JobSpec, limit: int | None, retry_errors: bool = False
) -> tuple[Preflight, list[WorkUnit], set[str]]:
    """Check everything, bind the output directory to this run, and list the work left:
    uncommitted units, plus (``retry_errors``) committed units that hold error rows."""
    pre = preflight(spec, limit)
    claim_output_dir(spec.output_dir, make_manifest(spec, pre.files, limit, pre.units))
    done = committed_units(spec.output_dir)
    errors = set(error_positions(spec.output_dir)) if retry_errors else set()
    return pre, [u for u in pre.units if u.unit_id not in done or u.unit_id in errors], errors


def run_job(
    spec: JobSpec, limit: int | None = None, progress: bool = True, retry_errors: bool = False
) -> RunStats:
    """Run one worker over the job: generate every unit that has no part and that it can claim
    (and, with ``retry_errors``, the error rows of committed units)."""
    started = time.perf_counter()
    pre, todo, error_rows = prepare_run(spec, limit, retry_errors)
    out_dir = spec.output_dir
    stats = RunStats(
        str(out_dir),
        run_id(),
        worker_name(),
        len(pre.units),
        units_skipped=len(pre.units) - len(todo),
    )
    if not todo:
        stats.wall_s = time.perf_counter() - started
        return stats
    try:
        Worker(spec, pre, progress).run(todo, stats, error_rows)
    finally:
        stats.wall_s = time.perf_counter() - started
        _log_run(out_dir, stats)
    return stats


def _log_run(out_dir: Path, stats: RunStats) -> None:
    """One JSON file per worker invocation under runs/: what it did, for reports and debugging."""
    runs = out_dir / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{stats.worker}.json"
    data = asdict(stats) | {"output_tokens_per_s": stats.output_tokens_per_s}
    (runs / name).write_text(json.dumps(data, indent=2) + "\n")
