"""Resume waste under kill -9: how much finished work a crash throws away.

Runs a job, kills the whole process group with SIGKILL at a random point (during engine start,
or a random moment after a unit commits), reruns, and repeats; a last run completes the job.
With ``--kill alone`` only the worker's process is killed (the OOM killer's way): its engine's
processes must die with it (``engines.procs``), and each trial counts those that outlived it
by ``DEATH_S``.
After each kill it reads the dead workers' last progress records (written at every heartbeat
beside the leases) to count rows that had finished generating but whose unit was not yet
committed: those rows are generated twice. Target: at most one unit per worker per kill.
Then it checks that every input id is in the output exactly once and every part is readable.

    .venv/bin/python scripts/bench/resume.py                  # 10 kills, default test job
    .venv/bin/python scripts/bench/resume.py --trials 20 --workers 2
    .venv/bin/python scripts/bench/resume.py --job J --trials 2 --no-finish --json
    .venv/bin/python scripts/bench/resume.py --kill alone      # the worker's pid alone

The test suite runs the same trials (tests/test_interrupts.py) through this script with
``--job`` (its own job, kept afterwards), ``--kill alone``, ``--no-finish`` and ``--json``.
The final check is ``batchspec export`` of the output, which refuses an unfinished output and
compares every committed id with the input's, row for row; the tests check with an oracle of
their own.
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
import pyarrow.parquet as pq
import yaml

from batchspec.spec.file import load_spec

ROOT = Path(__file__).resolve().parents[2]
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


def committed(out: Path) -> int:
    """Units committed in an output directory."""
    parts = out / "parts"
    return len(list(parts.glob("*.parquet"))) if parts.is_dir() else 0


def _lost_work(out: Path, since: float) -> tuple[int, int]:
    """Finished-but-uncommitted rows and open units of workers that wrote progress since."""
    rows = units = 0
    for path in (out / "leases").glob("*.progress.json"):
        if path.stat().st_mtime < since:
            continue
        data = json.loads(path.read_text())
        for unit_id, finished in data["units"].items():
            if not (out / "parts" / f"{unit_id}.parquet").exists():
                rows += finished
                units += 1
    return rows, units


def _start(job: Path, workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def kill_trials(
    job: Path,
    out: Path,
    trials: int,
    seed: int,
    workers: int = 1,
    startup_share: float = 0.2,
    alone: bool = False,
) -> list[Trial]:
    """Kill -9 a run of ``job`` ``trials`` times at random points (fewer if it finishes): its
    whole process group, or with ``alone`` its first process only."""
    rng = random.Random(seed)
    results = []
    for _ in range(trials):
        before = committed(out)
        started = time.time()
        proc = _start(job, workers)
        if rng.random() < startup_share:
            when, delay = "startup", rng.uniform(1.0, 15.0)
            time.sleep(delay)
        else:
            when, delay = "generating", rng.uniform(0.0, 3.0)
            while committed(out) == before and proc.poll() is None:
                time.sleep(0.1)
            time.sleep(delay)
        if proc.poll() is not None:
            break  # finished the job before the kill: nothing left to interrupt
        engines, survivors = _kill(proc, alone)
        rows, units = _lost_work(out, started)
        trial = Trial(when, delay, before, committed(out), rows, units, engines, len(survivors))
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


def finish(job: Path) -> None:
    """Run ``job`` to the end, as the user would after the last kill."""
    final = subprocess.run(
        [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"],
        capture_output=True,
        text=True,
    )
    if final.returncode != 0:
        raise RuntimeError(f"final run failed:\n{final.stderr[-3000:]}")


def check_exported(out: Path, dest: Path) -> str:
    """``batchspec export`` of the finished output: it proves every input id exactly once, in
    input order, and reads every part in full. Returns its summary line."""
    cmd = [sys.executable, "-m", "batchspec", "export", str(out), "--to", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"export refused the output:\n{result.stderr[-3000:]}")
    return result.stdout.strip()


def write_job(tmp: Path, rows: int, unit_rows: int, max_tokens: int) -> Path:
    """The default job over the first ``rows`` prompts, small units: many commits to kill.
    Progress is recorded at every heartbeat: it beats often to measure waste precisely."""
    table = pq.read_table(ROOT / "jobs" / "data" / "prompts.parquet").slice(0, rows)
    pq.write_table(table, tmp / "in.parquet")
    job = yaml.safe_load((ROOT / "jobs" / "synth_data.yaml").read_text())
    job["input"]["path"] = str(tmp / "in.parquet")
    job["output"] = {"dir": str(tmp / "out"), "unit_rows": unit_rows}
    job["model"].update(max_model_len=1024, max_num_seqs=8)
    job["sampling"]["max_tokens"] = max_tokens
    job["execution"] = {"heartbeat_s": 0.2, "lease_timeout_s": 60}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rows", type=int, default=240)
    ap.add_argument("--unit-rows", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--job", type=Path, help="kill runs of this job instead (--rows etc. unused); kept"
    )
    ap.add_argument(
        "--kill",
        choices=["group", "alone"],
        default="group",
        help="kill the run's process group, or its worker process alone (its engine must die too)",
    )
    ap.add_argument("--no-finish", action="store_true", help="no final run, no check")
    ap.add_argument("--json", action="store_true", help="print the trials as one JSON line")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as name:
        tmp = Path(name)
        job = args.job or write_job(tmp, args.rows, args.unit_rows, args.max_tokens)
        spec = load_spec(job)
        out = spec.output_dir
        alone = args.kill == "alone"
        trials = kill_trials(job, out, args.trials, args.seed, args.workers, alone=alone)
        checked = ""
        if not args.no_finish:
            finish(job)
            checked = check_exported(out, tmp / "export")
        if args.json:
            print(json.dumps([asdict(t) for t in trials]))
            return
        unit_rows = spec.output.unit_rows
        print(f"{len(trials)} kills, {args.workers} worker(s), unit_rows {unit_rows}: {out}")
        if checked:
            print(f"checked: {checked}")
        report(trials, unit_rows, args.workers, alone)


if __name__ == "__main__":
    main()
