"""What every benchmark does, in one place, so that each benchmark's file says only what it
measures: the transcript header the docs quote, ABBA rounds over named configurations, ratios
with their spread across rounds, a balanced sample of a job's rows, ``batchspec run`` on a job
with ``--set`` overrides (in a subprocess, as a user runs it), and a measurement in a fresh
process.

Benchmarks import it as ``from harness import ...``: Python puts a script's own folder first
on ``sys.path``, so this works from any working directory. Importing it quiets vLLM's and
transformers' logs (a transcript is read by people) unless the environment says otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
PROMPTS = JOBS / "data" / "prompts.parquet"
"""The default prompt set (``scripts/data/build.py prompts``)."""
BATCHSPEC = str(Path(sys.executable).with_name("batchspec"))
T = TypeVar("T")
PLANTED = {"BATCHSPEC_INJECT_ACCEPT_ALL": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""The planted sampler bias (every draft accepted, ``engines.planted``) that ``verify`` must
catch: it patches the CLI's own vLLM, so the engine runs in the CLI's process."""

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def parser(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring as help, and ``options``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    return options(ap, **defaults)


def options(ap: argparse.ArgumentParser, **defaults: Any) -> argparse.ArgumentParser:
    """Plain ``--name`` options, typed by their defaults (``max_tokens=64``: ``--max-tokens``,
    an int; False: a switch; None: a string, unset): what most of a benchmark's flags are."""
    for name, default in defaults.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(
                flag, type=type(default) if default is not None else str, default=default
            )
    return ap


def header() -> str:
    """The transcript's first line, as docs/benchmarks.md quotes it: the command, the date, the
    commit it ran at and the load, so a figure can be traced to what produced it."""
    script = Path(sys.argv[0]).resolve()
    rel = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = (
        subprocess.run(git, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        if shutil.which("git")
        else ""
    )
    args = " ".join(sys.argv[1:])
    line = f"$ .venv/bin/python {rel} {args}".rstrip()
    line += f"   # {time.strftime('%Y-%m-%d')}, commit {commit or '?'}"
    line += f", load {os.getloadavg()[0]:.1f}"
    print(line, flush=True)
    return line


def abba(
    configs: list[str], rounds: int, run: Callable[[str, int], T], show: Callable[[str, T], str]
) -> dict[str, list[T]]:
    """Every configuration once per round, the order reversed every other round (ABBA), so that
    a machine drifting over minutes favours no configuration; ``run(config, round)`` measures,
    ``show`` gives the line printed after each run. Results per configuration, in round order."""
    got: dict[str, list[T]] = {c: [] for c in configs}
    for r in range(rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            started = time.perf_counter()
            got[config].append(run(config, r))
            wall = time.perf_counter() - started
            print(f"  round {r + 1} {config}: {show(config, got[config][-1])} ({wall:.0f} s)",
                  flush=True)  # fmt: skip
    return got


def ratio(num: list[float], den: list[float]) -> str:
    """The ratio of the means, with the range of the per-round ratios: ``1.021 [0.990-1.050]``
    (the spread is what tells a difference from this machine's noise)."""
    per = [a / b for a, b in zip(num, den, strict=True)]
    spread = f" [{min(per):.3f}-{max(per):.3f}]" if len(per) > 1 else ""
    return f"{statistics.fmean(num) / statistics.fmean(den):.3f}{spread}"


def tee(path: Path) -> None:
    """This process's stdout copied to ``path`` as it is written (a device run cut short
    still leaves what it measured in the folder that comes back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout = _Tee(sys.stdout, path.open("w"))


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)


def copy_bandwidth(device: str = "cpu", floats: int = 1 << 28, reps: int = 10) -> float:
    """The memory bandwidth in GB/s that weights are read at against: a copy of ``floats``
    float32 (1 GiB) on ``device``, read + write bytes counted (as STREAM's copy does), best
    of ``reps``."""
    import torch

    src = torch.rand(floats, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        if device == "cuda":  # the copy is queued: wait for it
            torch.cuda.synchronize()

    return 2 * src.numel() * 4 / timed(copy, reps, min) / 1e9


def timed(fn: Callable[[], object], reps: int, pick: Callable = statistics.median) -> float:
    """Seconds a call of ``fn`` takes: ``pick`` (the median; ``min`` for the floor) of ``reps``
    timed calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return pick(times)


def step_ms(
    model: Any,
    rows: int,
    nodes: int,
    reps: int,
    pick: Callable = statistics.fmean,
    sizes: list[int] | None = None,
):
    """Ms of a tree-engine verify step of ``rows`` x ``nodes`` on a ``TreeModel`` (a chain
    behind each row's cache; the cost does not depend on the shape): ``pick`` of ``reps``
    timed steps after warm-ups that capture a CUDA graph where the model has them. ``sizes``:
    each row's chain holds that many nodes of the ``nodes`` (root included), packed as the
    engine runs unlike rows."""
    import torch

    slots = list(range(rows))
    pos = torch.tensor([model.cache_len[s] for s in slots]).unsqueeze(1) + torch.arange(nodes)
    mask = torch.ones(nodes, nodes, dtype=torch.bool).tril().expand(rows, nodes, nodes)
    tokens = torch.randint(100, model.vocab_size, (rows, nodes))

    def step() -> None:  # the host sync (.item()) ends it: wall time is the step's
        model.verify(slots, tokens, pos, mask, sizes=sizes)[0, 0].argmax().item()

    for _ in range(2):  # with timed's warm-up, three: the graph captured by then
        step()
    return timed(step, reps, pick) * 1e3


def ints(text: str) -> list[int]:
    """A comma list of integers, as the benchmarks take sizes and K on the command line."""
    return [int(x) for x in text.split(",") if x.strip()]


def balanced(
    files: list[Path],
    path: Path,
    per_domain: int | None = None,
    rows: int | None = None,
    domains: list[str] | None = None,
    columns: tuple[str | None, str] = ("domain", "id"),
):
    """The first ``per_domain`` rows of every domain (of ``domains``, default all) of the
    input ``files``, or ``rows`` rows taken from the domains in turn (each domain's first,
    then each one's second, ...), sorted by domain and id, written to ``path``; returns the
    frame. ``columns``: the domain column (None: the first rows) and the id column."""
    import polars as pl

    df = pl.concat([pl.read_parquet(f) for f in files])
    dom, ids = columns
    if dom is None:
        df = df.head(rows or df.height)
    else:
        df = df.filter(pl.col(dom).is_in(domains)) if domains else df
        rank = pl.int_range(pl.len()).over(dom).alias("_rank")
        df = df.sort(dom, ids).with_columns(rank)
        df = df.filter(pl.col("_rank") < per_domain) if per_domain else df
        df = df.sort("_rank", dom).head(rows or df.height).drop("_rank").sort(dom, ids)
    df.write_parquet(path)
    return df


def flags(**options: Any) -> list[str]:
    """``--name value`` pairs for a CLI call from keywords: ``max_tokens=8``, ``--max-tokens 8``."""
    return [x for key, value in options.items() for x in (f"--{key.replace('_', '-')}", str(value))]


def cli(*args: str, env: dict[str, str] | None = None, check: bool = False):
    """``batchspec ARGS`` in a subprocess from the repository root, output captured (with
    ``env`` over this environment): the finished process and its wall seconds. ``check``:
    exit with the command and its output's tail where it failed."""
    started = time.perf_counter()
    done = subprocess.run([BATCHSPEC, *args], env=os.environ | (env or {}), capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip
    if check and done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"batchspec failed ({done.returncode}): {' '.join(args)}\n{tail}")
    return done, time.perf_counter() - started


def run_cli(
    job: str | Path, out: Path, sets: list[str] = (), limit: int | None = None, check=True
) -> dict:
    """``batchspec run JOB --set ...`` into a fresh ``out``, as a user runs it; its figures
    from the run logs (``OUT/runs/*.json``): generation tok/s, engine start excluded, and the
    replay's seconds, rows checked and rows equal to the engine's own counts. ``check`` False:
    a run that failed gives its exit code and last line (``exit``, ``error``) instead."""
    args = ["run", str(job), "--output", str(out), "--no-progress"]
    args += ["--limit", str(limit)] if limit else []
    done, _ = cli(*args, *(x for s in sets for x in ("--set", s)), check=check)
    if done.returncode:
        return {"exit": done.returncode, "error": (done.stderr.strip().splitlines() or [""])[-1]}
    logs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    tokens, seconds = sum(d["output_tokens"] for d in logs), max(d["generate_s"] for d in logs)
    engines = [e for d in logs for e in d["engines"]]
    replay = ("s", "checked", "equal")
    return {
        "out": str(out),
        "tok_s": tokens / seconds,
        "tokens": tokens,
        "generate_s": seconds,
        "build_s": sum(d["engine_build_s"] for d in logs),
        "engines": engines,
        **{f"replay_{x}": sum(e.get(f"replay_{x}", 0) for e in engines) for x in replay},
    }


def parts(out: Path):
    """The committed parts of an output directory, as one frame (any parts layout)."""
    import polars as pl

    from batchspec.io.layout import OutDir

    return pl.read_parquet(OutDir(out).part_files())


def fresh(fn: Callable[..., dict], *args: Any) -> dict:
    """``fn(*args)`` (a module-level function of a benchmark, JSON arguments and result) in a
    fresh interpreter: its imports and caches are that call's alone."""
    module = sys.modules[fn.__module__]
    folder, name = Path(module.__file__).parent, Path(module.__file__).stem
    code = (
        f"import json, sys; sys.path[:0] = [{str(folder)!r}, {str(Path(__file__).parent)!r}]\n"
        f"from {name} import {fn.__name__} as fn\n"
        "print('@@' + json.dumps(fn(*json.loads(sys.argv[1]))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args, default=str)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{fn.__name__}{args}: exit {done.returncode}\n{done.stderr[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("@@"))
    return json.loads(line[2:])


def job_file(
    path: Path, base: str = "synth_data.yaml", rows: dict | None = None, **sections: dict
) -> Path:
    """The shipped job ``jobs/BASE`` with ``sections``' keys changed, written to ``path``: the
    checks run ``batchspec`` on job files, as a user does. Its input path is made absolute, or
    with ``rows`` is the default prompt set's ``balanced(**rows)`` written beside the job; a
    key given as None is left out (its default applies)."""
    import yaml

    job = yaml.safe_load((ROOT / "jobs" / base).read_text())
    job["input"]["path"] = str(ROOT / "jobs" / job["input"]["path"])
    if rows is not None:
        job["input"]["path"] = str(path.with_suffix(".parquet"))
        balanced([PROMPTS], path.with_suffix(".parquet"), **rows)
    for name, values in sections.items():
        merged = job.get(name, {}) | values
        job[name] = {key: value for key, value in merged.items() if value is not None}
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def verify(job: Path, out: Path, *args: str, env: dict | None = None, expected: int = 0):
    """``batchspec verify JOB --output OUT ARGS``: its report (None: none written), with the
    exit code and wall seconds added, and a line of figures: the exit code against
    ``expected`` (1 where a planted bias must be caught), every check, the seconds."""
    done, took = cli("verify", str(job), "--output", str(out), *args, env=env)
    reports = sorted((out / "verify").glob("report-*.json"))
    if not reports:
        return None, f"exit {done.returncode}, no report\n{done.stderr[-2000:]}"
    report = json.loads(reports[-1].read_text()) | {"exit": done.returncode, "seconds": took}
    verdict = "as expected" if done.returncode == expected else "UNEXPECTED"
    checks = " | ".join(check_line(c) for c in report["checks"])
    return report, f"exit {done.returncode} ({verdict}) | {checks} | {took:.0f} s"


def check_line(c: dict) -> str:
    """One check of a verify report as the checks print it: greedy rows identical, near-ties
    and failures; or the sampled two-sample tests and the distance they could detect."""
    if c["check"] == "greedy":
        drift = "n/a" if c["max_drift"] is None else f"{c['max_drift']:.2e}"
        low, high = c["min_margin"], c["max_margin"]  # nats, over near-ties and failures
        margins = "" if low is None else f", margins {low:.3g}..{high:.3g} nats"
        return (
            f"{c['dtype']}: {c['rows']} rows, {c['identical']} identical, {c['near_ties']} "
            f"near-ties, {c['failures']} failures{margins}, max drift {drift}"
        )
    return (
        f"{c['prompts']} prompts x {c['positions']} positions, {c['tests']} tests, "
        f"{c['rejected']} rejected, min p {c['min_p']:.3g} (Holm {c['min_p_holm']:.3g}), max TV "
        f"seen {c['max_tv_observed']:.3f}, detectable TV {c['detectable_tv_max']:.3f}"
    )
