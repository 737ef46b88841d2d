"""Resume waste under kill -9: how much finished work a crash throws away. Runs a job, kills
its process group with SIGKILL at a random point (during engine start, or after a unit
commits), reruns, and repeats; then finishes the job and exports it (``export`` refuses an
unfinished output and checks every input id once, in order). After each kill, the dead
workers' last progress records give the rows finished but not committed: generated twice.
``--kill alone`` kills the worker's process alone (the OOM killer's way) and counts the
processes that outlive it by ``DEATH_S``. tests/test_interrupts.py runs it with ``--job``.

    .venv/bin/python scripts/bench/resume.py                  # 10 kills, default test job
    .venv/bin/python scripts/bench/resume.py --job J --trials 2 --no-finish --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from harness import cli, job_file, options, parser

from batchspec.io.layout import OutDir
from batchspec.spec.file import load_spec

DEATH_S = 30.0
"""How long a killed worker's processes may take to die with it (0.1-0.3 s on a quiet
machine). A child spawned just before the kill dies only once it runs its first instruction
(``procs.arm_spawned_child``: its parent is gone, so it kills itself), and a Python start
under load took over 10 s in CI (the engine core and the resource tracker it holds open were
both still alive then); the wait ends as soon as all are gone."""


@dataclass
class Trial:
    when: str
    """'startup' (killed before its first commit) or 'generating'."""
    delay_s: float
    committed_before: int
    committed_after: int
    rows_finished_uncommitted: int
    """Rows generated but lost with the kill: they are generated again by the rerun."""
    units_open: int
    """Units the dead workers held leases on."""
    engine_processes: int = 0
    """The run's vLLM engine processes (``VLLM::...``) when it was killed."""
    survivors: int = 0
    """With ``--kill alone``: the run's processes still alive ``DEATH_S`` after the kill."""
    survivor_names: list[str] = field(default_factory=list)
    """Their command lines (what to look at when one survives)."""


def _lost_work(out: OutDir, since: float) -> tuple[int, int]:
    """Finished-but-uncommitted rows and open units of workers that wrote progress since."""
    rows = units = 0
    for path in out.progress_files():
        if path.stat().st_mtime < since:
            continue
        for unit_id, finished in json.loads(path.read_text())["units"].items():
            if not out.is_committed(unit_id):
                rows += finished
                units += 1
    return rows, units


def _start(job: str | Path, workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def kill_trials(
    job: str | Path,
    out: OutDir,
    trials: int,
    seed: int,
    workers: int = 1,
    alone: bool = False,
) -> list[Trial]:
    """Kill -9 a run of ``job`` ``trials`` times at random points (fewer if it finishes): its
    whole process group, or with ``alone`` its first process only."""
    rng = random.Random(seed)
    results = []
    for _ in range(trials):
        before = len(out.committed_units())
        started = time.time()
        proc = _start(job, workers)
        if rng.random() < 0.2:  # a fifth of the kills while the engine starts
            when, delay = "startup", rng.uniform(1.0, 15.0)
            time.sleep(delay)
        else:
            when, delay = "generating", rng.uniform(0.0, 3.0)
            while len(out.committed_units()) == before and proc.poll() is None:
                time.sleep(0.1)
            time.sleep(delay)
        if proc.poll() is not None:
            break  # finished the job before the kill: nothing left to interrupt
        engines, survivors = _kill(proc, alone)
        rows, units = _lost_work(out, started)
        after = len(out.committed_units())
        trial = Trial(when, delay, before, after, rows, units, engines, len(survivors))
        trial.survivor_names = survivors
        results.append(trial)
    return results


def _kill(proc: subprocess.Popen, alone: bool) -> tuple[int, list[str]]:
    """SIGKILL the run (alone: its first process only, then wait for the rest to die with
    it); its engine processes at the kill, and the processes that outlived it by DEATH_S.
    Whatever is left of its group is killed after."""
    procs = psutil.Process(proc.pid).children(recursive=True)
    engines = sum(_name(p).startswith("VLLM::") for p in procs)
    if alone:
        proc.kill()
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(procs, timeout=DEATH_S if alone else 0.5)
    names = [f"{p.pid} {_name(p)[:100]}" for p in alive] if alone else []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return engines, names


def _name(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def write_job(tmp: Path, rows: int, unit_rows: int, max_tokens: int) -> Path:
    """The default job over the first ``rows`` prompts, small units: many commits to kill.
    Progress is recorded at every heartbeat: it beats often to measure waste precisely."""
    return job_file(
        tmp / "job.yaml",
        rows={"rows": rows, "columns": (None, "id")},  # the first rows of the set
        output={"dir": str(tmp / "out"), "unit_rows": unit_rows},
        model={"max_model_len": 1024, "max_num_seqs": 8},
        sampling={"max_tokens": max_tokens},
        execution={"heartbeat_s": 0.2, "lease_timeout_s": 60},
    )


def report(trials: list[Trial], unit_rows: int, workers: int, alone: bool) -> None:
    """One line per kill, then the waste against its target."""
    for i, t in enumerate(trials, 1):
        print(
            f"kill {i:2d} ({t.when:10s} +{t.delay_s:4.1f} s): committed units "
            f"{t.committed_before:3d} -> {t.committed_after:3d}, open units {t.units_open}, "
            f"rows generated twice {t.rows_finished_uncommitted}"
            + (f", processes outliving the worker {t.survivors}" if alone else "")
        )
    worst = max((t.rows_finished_uncommitted for t in trials), default=0)
    total = sum(t.rows_finished_uncommitted for t in trials)
    bound = unit_rows * workers
    print(
        f"rows generated twice: {total} in all, worst kill {worst} "
        f"(target <= {bound}: one unit per worker per kill) -> "
        f"{'ok' if worst <= bound else 'MISSED'}"
    )


def parse_args() -> argparse.Namespace:
    # --job: kill runs of this job (kept; --rows etc. unused); --no-finish: no final run, no
    # check; --json: the trials as one JSON line.
    ap = parser(__doc__, trials=10, workers=1, rows=240, unit_rows=8, max_tokens=32, seed=0)
    ap.add_argument("--kill", choices=["group", "alone"], default="group", help="alone: the worker")
    return options(ap, job=None, no_finish=False, json=False).parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as name:
        tmp = Path(name)
        job = args.job or write_job(tmp, args.rows, args.unit_rows, args.max_tokens)
        spec = load_spec(job)
        out = OutDir(spec.output_dir)
        alone = args.kill == "alone"
        trials = kill_trials(job, out, args.trials, args.seed, args.workers, alone=alone)
        checked = ""
        if not args.no_finish:  # the user's last run, then export's check of every id
            cli("run", str(job), "--no-progress", check=True)
            done, _ = cli("export", str(out.root), "--to", str(tmp / "export"), check=True)
            checked = done.stdout.strip()
        if args.json:
            print(json.dumps([asdict(t) for t in trials]))
            return
        unit_rows = spec.output.unit_rows
        print(f"{len(trials)} kills, {args.workers} worker(s), unit_rows {unit_rows}: {out.root}")
        if checked:
            print(f"checked: {checked}")
        report(trials, unit_rows, args.workers, alone)


if __name__ == "__main__":
    main()
