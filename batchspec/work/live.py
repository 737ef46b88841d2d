"""Live progress of a run, as one worker sees it: every worker's rows, not only its own.

A thread refreshes twice a second from this worker's counters (the rows its engine finished
so far, unit by unit as they commit and row by row while they are open); this worker's record
is rewritten by its heartbeat (``Leases.beat``), not here. The others' records are read by one
worker at a time, the holder of a lock (taken over when its holder goes silent; tried every
``LEAD_S``), which writes their sum (``progress.write_summary``); the others read that sum,
as often as they show it. A worker that shows nothing (``off``) reads nothing. On a terminal
it draws a bar with a second line of acceptance per domain; elsewhere (Slurm logs, CI) it
prints one summary line every ``log_every`` seconds. While this worker starts an engine, both
say so (``starting``): the start is a run's longest silence.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TextIO

from tqdm import tqdm

from batchspec.io.layout import OutDir
from batchspec.io.temps import FileLock
from batchspec.work.progress import (
    SAMPLE_S,
    ProgressLog,
    RunTotals,
    acceptance,
    add_up,
    read_records,
    read_summary,
    write_summary,
)

REFRESH_S = 0.5
RATE_WINDOW_S = 60.0
"""Output tokens/s are shown over the last minute."""
ETA_WINDOW_S = 300.0
"""The ETA divides the rows left by the rows/s of the last five minutes (steadier)."""
DOMAINS_SHOWN = 20
SILENT_S = 60.0
"""A record not rewritten for this long, or three of its worker's heartbeats if that is
longer (``beat_s``), is a dead worker's: its open rows are lost work, not progress."""
LEAD_S = 300.0
"""How often a worker that does not write the summary tries to take the lock to write it."""


def _silent(record: dict) -> float:
    """Seconds without a rewrite after which a record is a dead worker's (``SILENT_S``)."""
    return max(SILENT_S, 3 * record.get("beat_s", 0.0))


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def domain_line(totals: RunTotals, limit: int = DOMAINS_SHOWN) -> str:
    """``domain acc/len K`` for the domains with most rows done, most first."""
    items = sorted(totals.domains.items(), key=lambda kv: -kv[1]["rows"])
    cells = []
    for domain, dom in items[:limit]:
        rate, length = acceptance(dom)
        acc = "-" if rate is None else f"{rate:.2f}/{length:.2f}"
        k = dom["k_in_use"] or ([dom["k_last"]] if dom["k_last"] is not None else [])
        cells.append(f"{domain or '-'} {acc} K{','.join(map(str, k)) or '-'}")
    more = f" (+{len(items) - limit} more: batchspec status)" if len(items) > limit else ""
    return "acceptance/mean len: " + " · ".join(cells) + more if cells else ""


class LiveProgress:
    """The run's progress, refreshed by a thread; ``mode``: ``bar``, ``log`` or ``off`` (the
    record is written in every mode: other workers and ``status`` read it). Without a ``log``
    (the launcher of ``--workers N``, which generates nothing itself) it only reads records."""

    def __init__(
        self,
        log: ProgressLog | None,
        out: OutDir,
        rows_total: int,
        legacy_rows: int,
        mode: str,
        log_every: float = 30.0,
        stream: TextIO | None = None,
    ):
        self.log = log
        self.out = out
        self.me = log.data["worker"] if log is not None else None
        self.rows_total = rows_total
        self.legacy = legacy_rows
        self.mode = mode
        self.log_every = log_every
        self.stream = stream or sys.stderr
        self._others = RunTotals(rows_total)
        """The other workers' records added up, as last read (every SAMPLE_S)."""
        self._history: deque[tuple[float, int, int]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: tqdm | None = None
        self._line: tqdm | None = None
        self.totals = RunTotals(rows_total)
        self.lead = FileLock(out.progress_lead, SILENT_S)
        self._leading = False
        self._tried = -float("inf")
        self._summed = False
        """``_others`` is the summary: every worker's record, this one's included."""
        self._waiting: str | None = None
        """What this worker waits for (an engine's start), shown in place of "generating"."""

    @staticmethod
    def mode_for(progress: bool, stream: TextIO | None = None) -> str:
        if not progress:
            return "off"
        return "bar" if (stream or sys.stderr).isatty() else "log"

    def start(self) -> None:
        """Read the records so far (the legacy rows are those no record counts), then run."""
        self._read_others()
        self.legacy = max(self.legacy - self._others.rows_committed, 0)
        if self.mode == "bar":
            fmt = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rows{postfix}"
            bar = {"file": self.stream, "dynamic_ncols": True}
            self._bar = tqdm(total=self.rows_total, bar_format=fmt, **bar)
            self._line = tqdm(total=0, bar_format="{desc}", position=1, leave=False, **bar)
            self._bar.set_description_str(self._waiting or "generating")
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def starting(self, what: str) -> Iterator[None]:
        """Shows ``what`` (``engines.starts.starting_line``) while the block runs: on the bar
        in place of "generating", in log mode as a line at once and in every summary line."""
        self._waiting = what
        if self.mode == "log":
            print(f"progress: {what}", file=self.stream, flush=True)
        try:
            yield
        finally:
            self._waiting = None

    def _loop(self) -> None:
        looked = logged = read = time.monotonic()
        while not self._stop.wait(REFRESH_S):
            now = time.monotonic()
            if now - looked >= SAMPLE_S:
                looked = now
                # A log line shows the others every log_every (the summary is written as
                # often), a bar every SAMPLE_S.
                if self.mode != "log" or now - read >= self.log_every:
                    read = now
                    self._read_others()
            self.refresh()
            if self.mode == "log" and now - logged >= self.log_every:
                logged = now
                print(self.summary(), file=self.stream, flush=True)

    def _read_others(self) -> None:
        """Add up the other workers' records (O(workers × domains)) if this worker writes
        the summary (or is the launcher, which has no record); else read the summary."""
        if self.log is not None and self.mode == "off":
            return  # shown nowhere: nothing to read
        if self.log is not None and not self._lead():
            summary = read_summary(self.out, SILENT_S)
            if summary is not None:
                self._others, self._summed = summary, True
            return
        others = read_records(self.out, skip=self.me)
        wall = time.time()
        live = {r["worker"] for r in others if not r["ended"] and wall - r["time"] < _silent(r)}
        self._others, self._summed = add_up(others, self.rows_total, live=live), False
        if self.log is not None:
            mine = self.log.snapshot()
            write_summary(
                self.out, add_up([mine], self.rows_total, live={self.me}, base=self._others)
            )

    def _lead(self) -> bool:
        """Whether this worker writes the summary: it holds the lock (refreshed here), or
        took it now (tried every ``LEAD_S``)."""
        if self._leading:
            self.lead.refresh()
            return True
        if time.monotonic() - self._tried >= LEAD_S:
            self._tried = time.monotonic()
            try:
                self._leading = self.lead.try_acquire()
            except FileNotFoundError:  # no progress/ yet: made then, not at every attempt
                self.out.progress_dir.mkdir(parents=True, exist_ok=True)
                self._leading = self.lead.try_acquire()
        return self._leading

    def refresh(self) -> RunTotals:
        """Totals as of now: this worker's live counters (O(domains) a refresh) plus the
        others' records as last read."""
        mine = [self.log.snapshot()] if self.log is not None and not self._summed else []
        live = {r["worker"] for r in mine}
        self.totals = t = add_up(mine, self.rows_total, self.legacy, live, base=self._others)
        now = time.monotonic()
        self._history.append((now, t.rows_done, t.output_tokens))
        while self._history and now - self._history[0][0] > ETA_WINDOW_S:
            self._history.popleft()
        if self._bar is not None and self._line is not None:
            self._bar.n = t.rows_done
            self._bar.set_description_str(self._waiting or "generating", refresh=False)
            self._bar.set_postfix_str(self._status(), refresh=False)
            self._bar.refresh()
            self._line.set_description_str(domain_line(t))
        return t

    def _rate(self, index: int, window: float) -> float | None:
        now = self._history[-1][0] if self._history else 0.0
        first = next((h for h in self._history if now - h[0] <= window), None)
        if first is None or now - first[0] < 2 * REFRESH_S:
            return None
        return (self._history[-1][index] - first[index]) / (now - first[0])

    def _status(self) -> str:
        t = self.totals
        tok = self._rate(2, RATE_WINDOW_S)
        tok_s = "-" if tok is None else f"{tok:.1f}"
        eta = _clock(t.eta_s(self._rate(1, ETA_WINDOW_S)))
        return f"{tok_s} output tok/s (last min), {t.error_rows} error rows, ETA {eta}"

    def summary(self) -> str:
        """One line for logs: rows of the run, tok/s, errors, ETA, acceptance per domain."""
        t = self.totals
        pct = 100.0 * t.rows_done / t.rows_total if t.rows_total else 100.0
        line = f"progress: {t.rows_done}/{t.rows_total} rows ({pct:.1f}%), {self._status()}"
        if self._waiting:
            line += f", {self._waiting}"
        domains = domain_line(t)
        return f"{line} | {domains}" if domains else line

    def close(self) -> None:
        """Stop the thread, write the final record and show the final state."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.log is not None:
            self.log.end()
        self._read_others()
        self.refresh()
        if self._leading:
            self.lead.release()
        if self.mode == "log":
            print(self.summary(), file=self.stream, flush=True)
        for bar in (self._line, self._bar):
            if bar is not None:
                bar.close()
