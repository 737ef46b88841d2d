"""Progress records: what each worker has done, cheap for anyone to add up while it runs.

Counting committed parts costs a directory listing and a footer per part (O(units)); a live
progress display that refreshes every second, or ``status`` in a cron job, should not pay that.
So every worker invocation keeps running counters (rows, error rows, output tokens, acceptance
per domain) and rewrites them, with the rows finished in the units it has open and a short
history of samples for rates over the last minutes, at each commit and every heartbeat: the
record is its heartbeat record, ``leases/<worker>.progress.json`` (``Leases.beat``; one
periodic write per worker, not two). When the worker ends (or a taker finds it dead) the
record moves to ``progress/<worker>.json`` and stays: the sum over all records, live and kept,
is the run's progress, at O(workers × domains) per read. Parts committed without a record (by
an older version, or by a worker killed between its commit and its record) are counted once at
a worker's start from the listing it makes anyway (``legacy`` in ``RunTotals``).

Reading every record costs one open per worker; with a thousand workers all doing it, that
is the filesystem's load. So one worker at a time (``live.LiveProgress``, holding a lock)
reads them all and writes their sum to ``progress/.summary.json``; the others read that one
file (``write_summary``, ``read_summary``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from batchspec.io.layout import OutDir
from batchspec.io.temps import temp_name
from batchspec.units import UnitRequests, UnitResult

if TYPE_CHECKING:
    from batchspec.work.leases import Leases

RECORD_VERSION = 1
SAMPLE_S = 10.0
"""Seconds between the samples a record keeps (for rates over the last minutes)."""
SAMPLES_KEPT = 100
"""Samples kept: 1,000 s at SAMPLE_S, enough for status's 15-minute window."""

_DOMAIN_SUMS = ("rows", "errors", "output_tokens", "drafted", "accepted", "steps")


def _domain_entry(domain: str | None) -> dict[str, Any]:
    return {"domain": domain, **dict.fromkeys(_DOMAIN_SUMS, 0), "k": None}


class ProgressLog:
    """This worker invocation's counters and its record file; thread-safe (the worker's loop
    commits, a display thread reads, the heartbeat writes the record).

    With ``leases`` the record is their heartbeat record (``Leases.beat`` writes it, at each
    beat and at each commit); without (tests, tools), ``write`` puts it in ``progress/``.
    Either way ``end`` writes the final record to ``progress/<worker>.json``."""

    def __init__(self, out: OutDir, worker: str, run_id: str, leases: Leases | None = None):
        self.out = out
        self.path = out.progress_record(worker)
        self._leases = leases
        if leases is not None:
            leases.record = self.snapshot
        self._lock = threading.Lock()
        now = time.time()
        self.data: dict[str, Any] = {
            "version": RECORD_VERSION,
            "worker": worker,
            "run_id": run_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": now,
            "time": now,
            "ended": False,
            "units_committed": 0,
            "rows_committed": 0,
            "error_rows": 0,
            "output_tokens": 0,
            "open": {"units": 0, "rows_finished": 0, "tokens_finished": 0, "k": None},
            "domains": [],
            "samples": [],
        }
        self._domains: dict[str | None, dict[str, Any]] = {}
        self._open: Callable[[], list[UnitRequests]] = list
        self._k: int | None = None
        self._sampled = 0.0

    def watch(self, open_units: Callable[[], list[UnitRequests]], k: int) -> None:
        """Where the units in flight are (the engine's source), and the engine's K."""
        with self._lock:
            self._open, self._k = open_units, k

    def committed(
        self,
        result: UnitResult,
        replaced: int | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        """A unit's rows are committed; ``replaced``: a retry of that many error rows, which
        are no new rows (only their errors may be gone). ``close`` takes the unit off the open
        ones, in the same step as its rows are counted, so no snapshot counts them twice."""
        errors = sum(r.error is not None for r in result.results)
        tokens = sum(r.num_output_tokens or 0 for r in result.results)
        with self._lock:
            if close is not None:
                close()
            d = self.data
            dom = self._domains.setdefault(result.unit.domain, _domain_entry(result.unit.domain))
            if replaced is None:
                d["units_committed"] += 1
                d["rows_committed"] += len(result.results)
                dom["rows"] += len(result.results)
            errors_added = errors - (replaced or 0)
            d["error_rows"] += errors_added
            d["output_tokens"] += tokens
            dom["errors"] += errors_added
            dom["output_tokens"] += tokens
            dom["k"] = result.k
            for r in result.results:
                if r.spec is not None and result.k > 0:
                    dom["drafted"] += r.spec.drafted
                    dom["accepted"] += r.spec.accepted
                    dom["steps"] += r.spec.steps
        self.write()

    def snapshot(self) -> dict[str, Any]:
        """The record as of now: counters, the units in flight, samples."""
        with self._lock:
            units = self._open()
            d = self.data
            now = time.time()
            d["time"] = now
            d["open"] = {
                "units": len(units),
                "rows_finished": sum(u.finished for u in units),
                "tokens_finished": sum(u.finished_tokens for u in units),
                "k": self._k,
                "domains": sorted({u.unit.domain for u in units}, key=lambda x: x or ""),
            }
            d["domains"] = [dict(v) for v in self._domains.values()]
            if now - self._sampled >= SAMPLE_S or d["ended"]:
                self._sampled = now
                rows = d["rows_committed"] + d["open"]["rows_finished"]
                tokens = d["output_tokens"] + d["open"]["tokens_finished"]
                d["samples"] = [*d["samples"][-(SAMPLES_KEPT - 1) :], [now, rows, tokens]]
            return json.loads(json.dumps(d))

    def write(self) -> dict[str, Any]:
        """Rewrite the record (atomically: readers never see half of it); returns it. With
        leases, a beat: it carries their heartbeat too."""
        if self._leases is not None and self._leases.record is not None:
            data = self._leases.beat()  # None once they stopped: ``end`` writes the last one
            return data if data is not None else self.snapshot()
        data = self.snapshot()
        self._write_kept(data)
        return data

    def _write_kept(self, data: dict[str, Any]) -> None:
        """The record in ``progress/`` (its directory made only when missing, not per write)."""
        tmp = temp_name(self.path)
        try:
            tmp.write_text(json.dumps(data))
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def end(self) -> dict[str, Any]:
        """The final record, kept in ``progress/``; the heartbeat no longer carries it (the
        leases' record, if they still beat, is removed when they stop)."""
        with self._lock:
            self.data["ended"] = True
            self._open = list
        if self._leases is not None:
            self._leases.record = None
        data = self.snapshot()
        self._write_kept(data)
        return data


def read_records(out: OutDir, skip: str | None = None) -> list[dict[str, Any]]:
    """Every worker invocation's progress record (but ``skip``'s): the running workers' in
    ``leases/``, the others' in ``progress/``; one per worker (the latest, should a record
    move between the two listings); unreadable ones, and bare heartbeats of older versions,
    left out."""
    found: dict[str, dict[str, Any]] = {}
    for path in [*out.progress_files(), *out.progress_records()]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # replaced or moved under us: read next time
        worker = data.get("worker")
        if data.get("version") != RECORD_VERSION or worker == skip:
            continue
        if worker not in found or data["time"] > found[worker]["time"]:
            found[worker] = data
    return list(found.values())


def _value_at(record: dict[str, Any], when: float, index: int) -> float:
    """A record's cumulative rows (index 1) or tokens (2) at time ``when``: its last sample
    at or before then, 0 before it started, its earliest sample if older ones are gone."""
    if when < record["started"]:
        return 0.0
    o = record["open"]
    now = [record["time"], record["rows_committed"] + o["rows_finished"]]
    now.append(record["output_tokens"] + o["tokens_finished"])
    samples = [*record["samples"], now]
    before = [s for s in samples if s[0] <= when]
    if before:
        return float(before[-1][index])
    return float(samples[0][index]) if samples else 0.0


@dataclass
class RunTotals:
    """The run's progress added up over the workers' records."""

    rows_total: int
    rows_open: int = 0
    """Rows finished in live workers' units not yet committed."""
    rows_committed: int = 0
    error_rows: int = 0
    output_tokens: int = 0
    domains: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    """Per domain: rows, errors, output_tokens, drafted, accepted, steps, and ``k_in_use``
    (the K of live workers' open units of the domain) and ``k_last`` (of its last unit)."""

    def rates(self, records: list[dict[str, Any]], now: float, window: float) -> tuple:
        """(rows/s, output tokens/s, seconds measured) over the last ``window`` seconds, or
        since the earliest record started if that is later."""
        if not records:
            return None, None, 0.0
        span = min(window, now - min(r["started"] for r in records))
        if span <= 0:
            return None, None, 0.0
        rows = tokens = 0.0
        for r in records:
            rows += _value_at(r, now, 1) - _value_at(r, now - span, 1)
            tokens += _value_at(r, now, 2) - _value_at(r, now - span, 2)
        return rows / span, tokens / span, span

    @property
    def rows_done(self) -> int:
        """Committed rows plus rows finished in units still open (at most the total)."""
        return min(self.rows_committed + self.rows_open, self.rows_total)

    def copy(self) -> RunTotals:
        domains = {d: {**v, "k_in_use": list(v["k_in_use"])} for d, v in self.domains.items()}
        return replace(self, domains=domains)

    def eta_s(self, rows_per_s: float | None) -> float | None:
        left = self.rows_total - self.rows_done
        if left <= 0:
            return 0.0
        return left / rows_per_s if rows_per_s else None


def add_up(
    records: list[dict[str, Any]],
    rows_total: int,
    legacy: int = 0,
    live: set[str] | None = None,
    base: RunTotals | None = None,
) -> RunTotals:
    """The run's totals from its records (``legacy``: committed rows no record counts).
    ``live``: the workers whose open units count (default: those that have not ended).
    ``base``: totals of other records already added up (a copy is added to): a display adds
    the other workers' records up when it reads them, and only its own at each refresh."""
    t = base.copy() if base is not None else RunTotals(rows_total)
    t.rows_committed += legacy
    for r in sorted(records, key=lambda r: r["time"]):  # the latest record's K comes last
        t.rows_committed += r["rows_committed"]
        t.error_rows += r["error_rows"]
        t.output_tokens += r["output_tokens"]
        is_live = not r["ended"] if live is None else r["worker"] in live
        if is_live:
            t.rows_open += r["open"]["rows_finished"]
            t.output_tokens += r["open"]["tokens_finished"]
        for dom in r["domains"]:
            acc = t.domains.setdefault(
                dom["domain"], {**dict.fromkeys(_DOMAIN_SUMS, 0), "k_in_use": [], "k_last": None}
            )
            for key in _DOMAIN_SUMS:
                acc[key] += dom[key]
            acc["k_last"] = dom["k"]
        if is_live and r["open"]["k"] is not None:
            for domain in r["open"].get("domains", []):
                acc = t.domains.setdefault(
                    domain, {**dict.fromkeys(_DOMAIN_SUMS, 0), "k_in_use": [], "k_last": None}
                )
                acc["k_in_use"] = sorted({*acc["k_in_use"], r["open"]["k"]})
    return t


def acceptance(dom: dict[str, Any]) -> tuple[float | None, float | None]:
    """(pooled acceptance rate, mean accepted length) of a domain's sums; None: no drafts."""
    rate = dom["accepted"] / dom["drafted"] if dom["drafted"] else None
    length = 1 + dom["accepted"] / dom["steps"] if dom["steps"] else None
    return rate, length


SUMMARY_VERSION = 1


def write_summary(out: OutDir, totals: RunTotals) -> None:
    """The run's totals as one small file, for the workers that do not read every record."""
    data = {
        "version": SUMMARY_VERSION,
        "time": time.time(),
        "totals": {**totals.__dict__, "domains": [[d, v] for d, v in totals.domains.items()]},
    }
    path = out.progress_summary
    tmp = temp_name(path)
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_summary(out: OutDir, max_age_s: float) -> RunTotals | None:
    """The latest summary, if one was written in the last ``max_age_s`` seconds."""
    try:
        data = json.loads(out.progress_summary.read_text())
    except (OSError, ValueError):
        return None
    if data.get("version") != SUMMARY_VERSION or time.time() - data["time"] > max_age_s:
        return None
    t = data["totals"]
    return RunTotals(**{**t, "domains": {d: v for d, v in t["domains"]}})
