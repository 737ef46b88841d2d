"""The worker loop: claim units, generate, commit, release; survive engine deaths and signals.

Data flows one way: spec -> preflight (checks, plan) -> scheduler (next unit and its K) ->
claim (lease) -> prompt builder -> engine -> writer (atomic part) -> release, and the unit's
measurements back to the K policy. Everything another worker or a later run needs lives in
the output directory (manifest, leases, parts, failure records, shared stats), so any number
of workers, started anywhere at any time, pick up exactly the units that have no part yet.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import TextIO

from batchspec.engines import Engine, EngineFailure
from batchspec.engines.quiet import EngineStartError, engine_output, log_size
from batchspec.engines.starts import remember_start, starting_line
from batchspec.errors import UserError
from batchspec.io.checks import Preflight
from batchspec.io.layout import OutDir
from batchspec.io.writer import Commit, PartWriter, output_schema
from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Observation
from batchspec.units import UnitResult, WorkUnit
from batchspec.work.backend import Backend, model_backend
from batchspec.work.claims import Claims, FailureLog
from batchspec.work.feeding import Replays, UnitKFeed
from batchspec.work.indexes import striped
from batchspec.work.leases import Leases
from batchspec.work.live import LiveProgress
from batchspec.work.prepare import prepare_run
from batchspec.work.progress import ProgressLog
from batchspec.work.runlog import (
    RunStats,
    bind_to_launcher,
    run_id,
    worker_name,
    write_run_log,
)
from batchspec.work.scheduler import Scheduler
from batchspec.work.seeding import Seeding, SeedingFeed
from batchspec.work.source import ClaimingSource
from batchspec.work.stopping import StopFlag


class Worker:
    """One worker of a run: every unit of ``todo`` that it can claim, engine by engine.

    ``backend``: what it generates with (``work.backend``; the model's by default). The
    worker's name is ``stats.worker``."""

    def __init__(
        self,
        spec: JobSpec,
        pre: Preflight,
        todo: list[WorkUnit],
        error_rows: set[str],
        stats: RunStats,
        backend: Backend | None = None,
    ):
        self.spec = spec
        self.stats = stats
        self.out = OutDir(spec.output_dir)
        self.backend = backend = backend or model_backend(spec, pre)
        ex = spec.execution
        name = stats.worker
        self.leases = Leases(self.out, name, ex.lease_timeout_s, ex.heartbeat_s, self._progress)
        self.failures = FailureLog(self.out, stats.run_id)
        self.claims = Claims(self.out, self.leases, self.failures, error_rows)
        policy = backend.policy(spec, self.out, name)
        self.scheduler = Scheduler(striped(todo, name), policy, self.leases.live_workers)
        self.stop = StopFlag(ex.shutdown_grace_s)
        self.leases.heart.on_lost = self._heartbeat_lost
        types = pre.column_types
        passthrough = {c: types[c] for c in spec.input.passthrough_columns}
        self.writer = PartWriter(self.out, output_schema(types[spec.input.id_column], passthrough))
        self._source: ClaimingSource | None = None
        self.live: LiveProgress | None = None
        """The progress shown (``run``'s): it says when an engine starts (``_build``)."""
        self.record = ProgressLog(self.out, name, stats.run_id, self.leases)  # one record
        self.replays = Replays(spec)
        self.seeding = Seeding(spec, pre.units, backend.tokenizer, self.replays)
        # Units the policy took only to explore, up to the last engine record: a probe is
        # taken before its engine starts, so each record counts from the previous one.
        self._explored_counted = 0
        todo_ids = {u.unit_id for u in todo}
        n = spec.sampling.n  # output rows per input row, as parts and progress count them
        self.rows_total = sum(u.num_rows for u in pre.units) * n
        self.rows_before = n * sum(
            u.num_rows for u in pre.units if u.unit_id not in todo_ids or u.unit_id in error_rows
        )
        """Rows committed when this worker started (those no progress record counts)."""

    def run(
        self, progress: str = "off", log_every: float = 30.0, stream: TextIO | None = None
    ) -> None:
        """Run to the end; ``progress``: ``bar``, ``log`` (a line every ``log_every`` s) or
        ``off`` (``LiveProgress``), shown on ``stream`` (default stderr)."""
        self.live = live = LiveProgress(
            self.record, self.out, self.rows_total, self.rows_before, progress, log_every, stream
        )
        live.start()
        self.leases.start()
        threading.Thread(target=self._on_stop, name="stop-release", daemon=True).start()
        engine: Engine | None = None
        # The handlers stay through the clean-up: a SIGTERM while the last engine closes (a
        # Slurm time limit can land there) is a stop like any other, not the default death.
        with self.stop.installed():
            try:
                while self.scheduler and not self.stop.stopping:
                    k, first = self.scheduler.next_engine(None if engine is None else engine.k)
                    if engine is not None and engine.k != k:
                        self._close(engine)
                        engine = None
                    engine = self._run_group(k, first, engine)
            finally:  # (a stop that ended a start, StartAborted, ends here too)
                if engine is not None:
                    self._close(engine)
                self.stats.units_abandoned += self._source.abandon_all() if self._source else 0
                self.leases.release_all()  # first: a lease whose holder's record has moved to
                self.leases.stop()  # progress/ is free at once (``LeaseDir.silence_of``)
                live.close()
                self.stats.stopped_by_signal = self.stop.signal is not None

    def _heartbeat_lost(self, reason: str) -> None:
        """Our record could not be written for half a lease timeout: others may take our
        units over soon, so we stop claiming, and the run ends non-zero (``Exit.ERROR``)."""
        self.stats.heartbeat_lost = reason
        self.stop.halt(reason)

    def _progress(self) -> dict[str, int]:
        return self._source.progress() if self._source is not None else {}

    def _on_stop(self) -> None:
        """On a stop, hand back at once what the engine has not started (other workers may
        be about to finish, and would otherwise leave those units to the next run)."""
        self.stop.tripped.wait()
        if self._source is not None:
            self._source.release_unstarted()

    def _run_group(self, k: int, first: WorkUnit | None, engine: Engine | None) -> Engine | None:
        """Units at one K, as long as the scheduler gives them; returns the engine, still up
        for the next group.

        A unit is claimed before any engine starts, so no engine starts for units others
        hold. After an engine failure the units in flight are retried on a new engine, alone
        and bisected down to a row that kills it (``quarantine``), until they commit or run
        out of attempts.
        """
        claimed = first is not None and self.claims.claim(first)
        unit = first if claimed else self.claims.next(self.scheduler, k)
        if unit is None:
            return engine
        if engine is None:
            engine = self._build(k)
            self.scheduler.rechoose(unit)  # its K was planned before the engine's costs
        builder = self.backend.prompts(engine)
        ex = self.spec.execution
        source = ClaimingSource(
            self.scheduler,
            self.claims,
            k,
            builder,
            self.stop,
            ex.linger_s,
            [unit],
            ex.max_unit_attempts,
        )
        self._source = source
        self.record.watch(source.open_units, k)
        while True:
            failure = self._drive(engine, source)
            if failure is None:
                # Aborted at the shutdown deadline: hand back what is left.
                self.stats.units_abandoned += source.abandon_all()
                return engine
            self._close(engine)
            self._after_failure(source, failure, engine)
            if self.stop.stopping or not source.has_work():
                return None
            engine = self._build(k)

    def _drive(self, engine: Engine, source: ClaimingSource) -> str | None:
        """Run the engine on the source and commit what it yields; the failure, if it died."""
        record = {
            "engine": self.spec.speculative.engine,
            "method": engine.method,
            "num_speculative_tokens": engine.k,
            "build_s": round(engine.build_s, 3),
            "units": 0,
            "output_tokens": 0,
        }
        started = time.perf_counter()
        replay = self.replays
        replay_s, replayed, checked, equal = (
            replay.seconds,
            replay.rows,
            replay.checked,
            replay.equal,
        )
        feed = UnitKFeed(source, self.scheduler) if engine.k_per_unit else source
        seeded, feed = self.seeding.mark(), SeedingFeed(feed, self.seeding)
        try:
            for result in engine.run(feed, self.stop.expired):
                whole = source.finished(result)
                if whole is not None:
                    record["units"] += 1
                    record["output_tokens"] += self._commit(whole, source, result is whole)
        except EngineFailure as exc:
            record["failure"] = str(exc)
        finally:
            gen_s = time.perf_counter() - started
            self.stats.generate_s += gen_s
            record["generate_s"] = round(gen_s, 3)
            record["replay_s"] = round(replay.seconds - replay_s, 3)
            record["rows_replayed"] = replay.rows - replayed
            record["replay_checked"] = replay.checked - checked
            record["replay_equal"] = replay.equal - equal
            record.update(self.seeding.since(seeded))
            explored = self.scheduler.policy.explored
            record["units_explored"] = explored - self._explored_counted
            self._explored_counted = explored
            self.stats.engines.append(record)
        return record.get("failure")

    def _build(self, k: int) -> Engine:
        since = log_size()
        kind, model = self.spec.speculative.engine, self.spec.model.model
        assert self.live is not None, "engines start within run()"
        try:
            with self.live.starting(starting_line(kind, model)):
                engine = self.backend.open_engine(self.spec, k, lambda: self.stop.stopping)
        except UserError:
            raise
        except Exception as exc:  # its cause is in the engine's output
            error = EngineStartError(exc, since)
            traceback.print_exc()  # into the log (on the terminal when verbose)
            raise error from exc
        self.scheduler.policy.measured_start(engine.build_s)
        remember_start(kind, model, engine.build_s)
        self.scheduler.policy.engine_up(engine)
        self.replays.engine_up(engine)
        self.seeding.engine_up(engine)  # after the replay's: both start empty
        self.stats.engine_build_s += engine.build_s
        self.stats.engine_builds += 1
        return engine

    def _close(self, engine: Engine) -> None:
        started = time.perf_counter()
        engine.close()
        self.stats.engine_close_s += time.perf_counter() - started

    def _after_failure(self, source: ClaimingSource, error: str, engine: Engine) -> None:
        """Units in flight when the engine died: to the quarantine, or, out of attempts,
        recorded as failed; units that only a poison row held back are committed."""
        self.stats.engine_failures += 1
        if self.stop.stopping:
            self.stats.units_abandoned += source.abandon_all()
            return
        for requests in source.crashed(error):
            uid = requests.unit.unit_id
            self.failures.record(requests.unit, source.quarantine.attempts[uid], error)
            self.stats.units_failed += 1
            source.abandon(uid)
        for whole in source.quarantine.completed(engine.k, engine.method, engine.name):
            self._commit(whole, source, learn=False)

    def _commit(self, result: UnitResult, source: ClaimingSource, learn: bool = True) -> int:
        """Write a unit's part, release it, learn from it (unless its rows ran apart, alone:
        not the batch the K controller models); returns its output tokens."""
        unit_id = result.unit.unit_id
        self.replays.replay(result)
        outcome, _ = self.writer.commit(result)
        if outcome is Commit.DISCARDED:
            self.stats.units_discarded += 1
        else:
            self.stats.units_committed += 1
        if outcome is Commit.COMMITTED:
            self.failures.clear(unit_id)
        positions = result.unit_requests.positions
        replaced = None if positions is None else len(positions)
        if outcome is Commit.DISCARDED:
            source.done(unit_id)
        else:
            self.record.committed(result, replaced, close=lambda: source.done(unit_id))
        if learn:
            ob = Observation.from_result(result, self.spec.model.max_num_seqs)
            self.scheduler.policy.observe(ob)
        tokens = sum(r.num_output_tokens or 0 for r in result.results)
        self.stats.rows += len(result.results)
        errors = [r.error for r in result.results if r.error is not None]
        self.stats.error_rows += len(errors)
        self.stats.count_errors(errors)
        self.stats.output_tokens += tokens
        return tokens


def run_job(
    spec: JobSpec,
    limit: int | None = None,
    progress: bool | str = True,
    retry_errors: bool = False,
    log_every: float = 30.0,
) -> RunStats:
    """Run one worker over the job: generate every unit that has no part and that it can claim
    (and, with ``retry_errors``, the error rows of committed units). ``progress``: True for a
    bar on a terminal and a line every ``log_every`` s elsewhere, or a ``LiveProgress`` mode.
    What the engines print goes to the worker's log under ``runs/`` (``engines.quiet``)."""
    started = time.perf_counter()
    bind_to_launcher()
    pre, todo, error_rows, routed = prepare_run(spec, limit, retry_errors)
    stats = RunStats(
        str(spec.output_dir),
        run_id(),
        worker_name(),
        len(pre.units),
        units_skipped=len(pre.units) - len(todo),
        stage_s=pre.reader.stage_s,
    )
    if not todo:
        stats.wall_s = time.perf_counter() - started
        return stats
    try:
        mode = LiveProgress.mode_for(progress) if isinstance(progress, bool) else progress
        with engine_output(OutDir(spec.output_dir).engine_log(stats.worker)) as terminal:
            Worker(routed, pre, todo, error_rows, stats).run(mode, log_every, terminal)
    finally:
        stats.wall_s = time.perf_counter() - started
        write_run_log(OutDir(spec.output_dir), stats)
    return stats
