"""The output directory's layout: one object names every path in it.

Workers on many nodes share nothing but this directory, so its layout is the protocol between
them, and between them and ``status``, ``report`` and later runs. Every module asks ``OutDir``
for a path rather than joining names of its own::

    OUT/
      manifest.json   spec hash (and keys), input fingerprint, limit, units, unit id scheme,
                      parts layout: binds the directory to one run
      parts/          one Parquet file per committed work unit (<unit_id>.parquet); in a run
                      of FANOUT_UNITS units or more, fanned out into subdirectories of about
                      BUCKET_UNITS consecutive units each (parts/<bucket>/<unit_id>.parquet)
      leases/         claims of units in flight (<unit_id>.lease), and one record per running
                      worker (<worker>.progress.json), rewritten every heartbeat and at each
                      commit: the heartbeat of all its leases, and its progress record
                      (counters, recent samples, rows finished per unit it holds)
      progress/       the progress records of worker invocations that ended or were found
                      dead (<worker>.json), moved here from leases/ and kept (live progress,
                      status)
      job.json        the job spec of the latest run (export's dataset card, input order)
      failed/         units given up after repeated engine failures (<unit_id>.json)
      history/        earlier versions of parts replaced by --retry-errors
      runs/           one JSON log per worker invocation, and its engines' output
                      (<worker>.log: vLLM's and the libraries' logs, warnings)
      stats/          per-unit measurements shared by the workers' K controllers (<worker>.jsonl)
      tuning.json     batchspec tune's measurements
      slurm/          sbatch scripts, submitted job ids (jobs.jsonl), one log per array task
      staged/         input files with large row groups, copied once into one row group per
                      unit (<stem>-<key>/s<first row>.parquet) so a unit read costs its rows

The parts layout is recorded in the manifest that binds the directory (written once,
atomically) and read from there by everyone, never probed: a worker that missed a mark file
(a stale negative lookup on NFS) would commit a second copy under the other layout's name.
Only the recorded layout is listed (``stray_parts``: never read). An older batchspec refuses
such a directory before any write (``Manifest(**json)`` raises on the new keys: "unreadable run
manifest", exit 2). A legacy manifest (no record) keeps the old rule: ``parts/.fanout`` marks
the layout, chosen by the first run (``choose_layout``), and both layouts are listed.

Files being written are dot-named temporaries beside their final name (``temps.temp_name``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

PART_SUFFIX = ".parquet"
LEASE_SUFFIX = ".lease"
HEARTBEAT_SUFFIX = ".progress.json"
FANOUT_MARK = ".fanout"  # a fanned-out parts/ in a legacy directory (no recorded layout)
FLAT, FANOUT = "flat", "fanout"
FANOUT_UNITS = 4096
"""Runs of this many units or more fan their parts out into subdirectories."""
BUCKET_UNITS = 1024
"""Consecutive units per subdirectory of a fanned-out parts/ (one listing tells a worker
walking the plan which of them are done)."""
_UNIT_ID = re.compile(r"^f(\d+)-r(\d+)-(\d+)")


def bucket_of(unit_id: str) -> str:
    """The subdirectory of a unit's part in a fanned-out parts/: file and row range, so
    consecutive units share one (a unit id of another form goes by its hash)."""
    m = _UNIT_ID.match(unit_id)
    if m is None:
        return "h" + hashlib.sha1(unit_id.encode()).hexdigest()[:3]
    file, start, stop = (int(g) for g in m.groups())
    span = max(stop - start, 1) * BUCKET_UNITS
    return f"f{file:04d}-b{start // span:06d}"


def layout_for(num_units: int) -> str:
    """The parts layout of a run of ``num_units`` units, recorded in its manifest."""
    return FANOUT if num_units >= FANOUT_UNITS else FLAT


def _listing(folder: Path) -> list[str]:
    """A directory's names, sorted; none if it is missing (one readdir, no stat: the
    summary's writer lists leases/ and progress/ at every pass)."""
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def unit_ids_in(folder: Path, suffix: str) -> set[str]:
    """Unit ids of the ``<unit_id><suffix>`` files in one directory (parts, leases, failure
    records), from one listing, dot-named temporaries left out; none if it is missing."""
    n = len(suffix)
    return {x[:-n] for x in _listing(folder) if x.endswith(suffix) and not x.startswith(".")}


def create_mark(path: Path) -> None:
    """Create an empty marker file unless it exists (racing creators all succeed)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


class _Under:
    """A fixed path of an output directory (``OutDir.leases``, ...): ``names`` under its root.
    One line per path, so the class reads as the layout it names."""

    def __init__(self, *names: str):
        self.names = names

    def __get__(self, out: OutDir, owner: type | None = None) -> Path:
        return out.root.joinpath(*self.names)


class OutDir:
    """An output directory: the paths in it, and what is committed there.

    A unit is done exactly when ``parts/<unit_id>.parquet`` exists (parts are linked into place
    whole), so ``committed_units`` is the one answer to "what is done" for every reader.
    """

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._part_rows: dict[str, int] = {}
        """Row counts of parts already read, by file name (a part's row count never changes)."""
        self._layout: tuple[bool, bool] | None = None
        """(fanned out, recorded by the manifest), once known: it never changes."""

    def __repr__(self) -> str:
        return f"OutDir({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    # -- paths --------------------------------------------------------------------------------

    manifest = _Under("manifest.json")
    parts = _Under("parts")
    leases = _Under("leases")
    progress_dir = _Under("progress")
    progress_summary = _Under("progress", ".summary.json")
    """All records added up by one worker (``work.progress``), for the others to read."""
    progress_lead = _Under("progress", ".summary.lock")
    """The lock of the worker that writes the summary."""
    job_record = _Under("job.json")
    """The job spec the latest run used, with its input files (``batchspec export``)."""
    failed = _Under("failed")
    history = _Under("history")
    runs = _Under("runs")
    stats = _Under("stats")
    tuning = _Under("tuning.json")
    slurm = _Under("slurm")
    slurm_jobs = _Under("slurm", "jobs.jsonl")
    staged = _Under("staged")

    @property
    def fanout(self) -> bool:
        """Whether parts are fanned out, as the manifest records (legacy: the mark)."""
        return self._known_layout()[0]

    def _known_layout(self) -> tuple[bool, bool]:
        """(fanned out, recorded), from the manifest once there (a damaged one: UserError)."""
        if self._layout is None:
            from batchspec.io.manifest import read_manifest  # it names paths through OutDir

            manifest = read_manifest(self)
            if manifest is None or manifest.parts_layout is None:  # unbound, or legacy
                known = ((self.parts / FANOUT_MARK).exists(), False)
                if manifest is None:
                    return known  # asked again once a run binds the directory
                self._layout = known
            else:
                self._layout = (manifest.parts_layout == FANOUT, True)
        return self._layout

    def choose_layout(self, num_units: int) -> None:
        """Legacy: fan out a large run's parts unless flat ones are there (recorded: kept)."""
        fanout, recorded = self._known_layout()
        if recorded or fanout or num_units < FANOUT_UNITS:
            return
        self.parts.mkdir(parents=True, exist_ok=True)
        if any(p.is_file() for p in self.parts.glob(f"*{PART_SUFFIX}")):
            return
        create_mark(self.parts / FANOUT_MARK)
        self._layout = (True, False)

    def part_dir(self, unit_id: str) -> Path:
        """The directory a unit's part is committed in."""
        return self.parts / bucket_of(unit_id) if self.fanout else self.parts

    def part(self, unit_id: str) -> Path:
        return self.part_dir(unit_id) / f"{unit_id}{PART_SUFFIX}"

    def parts_in(self, folder: Path) -> set[str]:
        """Unit ids committed in one directory of parts (one listing)."""
        return unit_ids_in(folder, PART_SUFFIX)

    def lease(self, unit_id: str) -> Path:
        return self.leases / f"{unit_id}{LEASE_SUFFIX}"

    def progress(self, worker: str) -> Path:
        """A running worker's record: its heartbeat and progress, rewritten per beat."""
        return self.leases / f"{worker}{HEARTBEAT_SUFFIX}"

    def progress_files(self) -> list[Path]:
        """The records of running workers (and of killed ones, until taken over)."""
        return [self.leases / n for n in _listing(self.leases) if n.endswith(HEARTBEAT_SUFFIX)]

    def progress_record(self, worker: str) -> Path:
        """Where a worker invocation's progress record (``work.progress``) is kept after it
        ends (while it runs, the record is ``progress(worker)``)."""
        return self.progress_dir / f"{worker}.json"

    def progress_records(self) -> list[Path]:
        """The kept records of worker invocations that ended (or were found dead)."""
        names = _listing(self.progress_dir)
        return [self.progress_dir / n for n in names if n.endswith(".json") and n[0] != "."]

    def failure(self, unit_id: str) -> Path:
        return self.failed / f"{unit_id}.json"

    def engine_log(self, worker: str) -> Path:
        """What a worker's engines printed (``engines.quiet``): kept off the terminal."""
        return self.runs / f"{worker}.log"

    def stats_file(self, worker: str) -> Path:
        return self.stats / f"{worker}.jsonl"

    def staged_copy(self, name: str) -> Path:
        """A staged input file: a directory of shards, complete once it exists."""
        return self.staged / name

    def staging_lock(self, name: str) -> Path:
        return self.staged / f"{name}.lock"

    def temp_dirs(self) -> list[Path]:
        """Where writers leave temporaries: the root, parts/ (and buckets), staged/."""
        return [self.root, self.parts, *self._buckets(), self.staged]

    def _buckets(self) -> list[Path]:
        if not self.fanout:
            return []
        names = _listing(self.parts)  # none yet before the first commit
        return [self.parts / n for n in names if n[0] != "." and (self.parts / n).is_dir()]

    # -- what is committed --------------------------------------------------------------------

    def part_files(self) -> list[Path]:
        """Committed parts of the recorded layout (legacy: both), sorted by unit id
        (temporary files are dot-named and left out)."""
        if not self.parts.is_dir():
            return []
        fanout, recorded = self._known_layout()
        found = [] if fanout and recorded else self._flat_parts()
        for folder in self._buckets():
            found += [folder / f"{u}{PART_SUFFIX}" for u in self.parts_in(folder)]
        return sorted(found, key=lambda p: p.name)

    def _flat_parts(self) -> list[Path]:
        return list(self.parts.glob(f"[!.]*{PART_SUFFIX}"))

    def stray_parts(self) -> list[Path]:
        """Parts outside the recorded layout (copied by hand, or a writer that got it wrong):
        never listed, so never read; their units are generated again in place."""
        fanout, recorded = self._known_layout()
        if not recorded or not self.parts.is_dir():
            return []
        if fanout:
            return sorted(self._flat_parts())
        found = self.parts.glob(f"*/[!.]*{PART_SUFFIX}")
        return sorted(p for p in found if p.parent.name[0] != ".")

    def committed_units(self) -> set[str]:
        """Unit ids whose part is in place under its final name."""
        return {p.name[: -len(PART_SUFFIX)] for p in self.part_files()}

    def is_committed(self, unit_id: str) -> bool:
        return self.part(unit_id).exists()

    def rows_committed(self) -> int:
        """Rows in committed parts, from their footers; each part's footer is read once."""
        import pyarrow.parquet as pq

        for path in self.part_files():
            if path.name not in self._part_rows:
                try:
                    self._part_rows[path.name] = pq.ParquetFile(path).metadata.num_rows
                except OSError:
                    continue  # removed or replaced under us: counted next time
        return sum(self._part_rows.values())
