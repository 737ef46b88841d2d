"""The sbatch scripts batchspec writes, with every value from a job file or a flag quoted or
refused, so that no value can add a line, an option or a command.

A script has two readers. Bash runs its body: the command line there is ``shlex``-quoted, so
any printable value is one word. Sbatch reads its ``#SBATCH`` lines with a tokenizer of its
own, not a shell's: words split at whitespace, ``#`` starts a comment (even inside quotes in
older Slurm), only double quotes group a word in every version (single quotes only since
19.05), a backslash escapes the next character, and ``packjob``/``hetjob`` anywhere on a line
is blanked out. So a value there is checked against a safe charset for its option (a job
name, a partition, an account, a time), or, where any text is legitimate (a path, the value
of an extra option), written in double quotes with ``\\``, ``"`` and ``#`` escaped. Newlines
and other control characters are refused everywhere: nothing can carry them on one line.
"""

from __future__ import annotations

import re
import shlex
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from batchspec.errors import UserError
from batchspec.io.layout import OutDir

FINISHER_TIME_S = 30 * 60
"""The finisher's time limit (or the array's ``--time``, if shorter): it only reads the
output directory."""


@dataclass
class SubmitOptions:
    """What the user asked of Slurm (``batchspec slurm submit`` options)."""

    tasks: int = 1
    gpus_per_task: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    job_name: str | None = None
    signal_lead_s: int = 120
    """Seconds before the time limit at which the early-warning SIGTERM reaches the task."""
    extra: list[str] = field(default_factory=list)
    """Further sbatch options, one ``#SBATCH`` line each (their values quoted)."""


WORD = re.compile(r"[A-Za-z0-9._+-]+")
"""A job name or an account: no character that sbatch's tokenizer (or a reader of squeue's
output) treats specially."""
PARTITIONS = re.compile(r"[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*")
"""One partition, or a comma-separated list of them (Slurm takes the first that fits)."""
EXTRA = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*)(?:=(.*))?|(-[A-Za-z])(.*)", re.DOTALL)
"""An extra sbatch option: ``--name``, ``--name=value`` or ``-Xvalue``."""
TIME_FORMAT = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)")
"""Slurm's ``--time``: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
OUT_WHAT = "output.dir (or --output)"
"""How a refusal names the output directory: the job's key, or the flag that overrides it."""
REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
"""Control and format characters, undecodable bytes (surrogates), line and paragraph
separators: refused in every value of a script."""


def refuse_control(what: str, value: str) -> str:
    """``value`` unless it holds a character no script line can carry (``UserError`` naming
    ``what``, the field or flag it came from)."""
    for ch in value:
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            raise UserError(
                f"{what}: {value!r} holds a control character (U+{ord(ch):04X}); "
                "a Slurm script cannot carry it"
            )
    return value


def _checked(what: str, value: str, pattern: re.Pattern[str], allowed: str) -> str:
    """``value`` if it fully matches ``pattern`` (and sbatch keeps it whole), else a
    ``UserError`` naming ``what``."""
    refuse_control(what, value)
    if not pattern.fullmatch(value):
        raise UserError(f"{what}: {value!r} is not allowed in a Slurm script ({allowed})")
    return _no_het(what, value)


def time_limit_s(text: str) -> int | None:
    """Seconds of a Slurm ``--time`` value; None for no limit (``UNLIMITED``, ``INFINITE``,
    0); ValueError for anything Slurm would refuse at submission (surrounding whitespace
    included: the value goes into the script as it is)."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = TIME_FORMAT.fullmatch(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
            "UNLIMITED)"
        )
    d, h, dm, ds, a, b, c = (int(x) if x else 0 for x in m.groups())
    if m.group(1) is not None:
        seconds = ((d * 24 + h) * 60 + dm) * 60 + ds
    elif m.group(7) is not None:
        seconds = (a * 60 + b) * 60 + c  # HH:MM:SS
    else:
        seconds = a * 60 + b  # MM or MM:SS
    return seconds or None


def sbatch_quote(value: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line, whatever its printable characters:
    bare when it is made of safe characters, else in double quotes with ``\\``, ``"`` and
    ``#`` escaped (read alike by every Slurm version's tokenizer)."""
    if re.fullmatch(r"[A-Za-z0-9._+:@%,=/-]+", value):
        return value
    return '"' + re.sub(r'([\\"#])', r"\\\1", value) + '"'


def _no_het(what: str, value: str) -> str:
    """sbatch blanks ``packjob`` and ``hetjob`` (any case) wherever they appear on a line."""
    if re.search("packjob|hetjob", value, re.IGNORECASE):
        raise UserError(
            f"{what}: {value!r} contains 'packjob' or 'hetjob', which sbatch erases from "
            "#SBATCH lines"
        )
    return value


def log_path(what: str, folder: Path, name: str) -> str:
    """An ``--output`` value in ``folder``: ``%`` doubled (Slurm's filename patterns), and a
    backslash refused (it turns Slurm's patterns off)."""
    text = _no_het(what, refuse_control(what, str(folder)))
    if "\\" in text:
        raise UserError(f"{what}: {text!r} holds a backslash, which Slurm log paths cannot")
    return sbatch_quote(f"{text.replace('%', '%%')}/{name}")


def extra_option(arg: str) -> str:
    """One extra sbatch option as an ``#SBATCH`` word: the option's name checked, its value
    quoted; ``--wrap`` refused (batchspec writes the script itself)."""
    what = f"sbatch option {arg.partition('=')[0]!r}"
    m = EXTRA.fullmatch(_no_het(what, refuse_control(what, arg)))
    if m is None:
        raise UserError(f"{what}: not an option (give each as one argument: --qos=high)")
    name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4) or None)
    if name == "--wrap":
        raise UserError(f"{what}: batchspec writes the script itself; --wrap cannot be used")
    if value is None:
        return name
    return f"{name}={sbatch_quote(value)}" if name.startswith("--") else name + sbatch_quote(value)


def _common_options(opts: SubmitOptions, job_name: str, time: str | None) -> list[str]:
    """The options the array and the finisher share: name, partition, account, time."""
    word = "letters, digits, ._+-"
    lines = [f"#SBATCH --job-name={_checked('name', job_name, WORD, word)}"]
    if opts.partition:
        parts = "letters, digits, ._- and commas between partitions"
        partition = _checked("--partition", opts.partition, PARTITIONS, parts)
        lines.append(f"#SBATCH --partition={partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={_checked('--account', opts.account, WORD, word)}")
    if time:
        _checked_time(time)
        lines.append(f"#SBATCH --time={time}")
    return lines


def _checked_time(time: str) -> int | None:
    """``time_limit_s`` of a ``--time`` value, its refusal a ``UserError``."""
    refuse_control("--time", time)
    try:
        return time_limit_s(time)
    except ValueError as exc:
        raise UserError(f"--time: {exc}") from None


def _command(args: list[str], what: list[str]) -> str:
    """A command line for bash, each argument one word (``shlex``); ``what`` names where
    each came from, for the refusal of a control character."""
    return shlex.join(refuse_control(w, a) for w, a in zip(what, args, strict=True))


def _run_command(job: Path, out: OutDir, run_args: list[str], workers: int) -> str:
    """The worker's command line: ``batchspec run`` of this job into this directory."""
    args = [sys.executable, "-m", "batchspec", "run", str(job), "--output", str(out.root)]
    what = ["the Python interpreter's path", "", "", "", "JOB", "", OUT_WHAT]
    for arg in run_args:
        args.append(arg)
        what.append(arg.partition("=")[0])
    if workers > 1:
        args += ["--workers", str(workers)]
        what += ["", ""]
    return _command(args, what)


def render_script(
    job: Path, out: OutDir, run_args: list[str], opts: SubmitOptions, workers_per_task: int
) -> str:
    """The sbatch script: an array of workers of one run (``UserError`` for a value that
    cannot go into it, before anything is written)."""
    # No terminal in a task: its log gets a progress line every --log-every seconds.
    command = _run_command(job, out, run_args, workers_per_task)
    lines = [
        *_array_options(opts, out),
        "",
        "# Written by `batchspec slurm submit`; submit again by hand with: sbatch <this file>",
        "set -u",
        'export BATCHSPEC_RUN_ID="slurm-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"',
        'echo "batchspec task ${SLURM_ARRAY_TASK_ID:-0} of job ${SLURM_ARRAY_JOB_ID:-} '
        'on $(hostname) gpus=${CUDA_VISIBLE_DEVICES:-none} start $(date -Is)"',
        f"{command} &",
        "worker=$!",
        "trap 'echo \"batchspec: SIGTERM, stopping the worker\"; kill -TERM $worker' TERM",
        "wait $worker",
        "rc=$?",
        # wait returns early when the trap fires: wait again for the worker's own exit code.
        "if kill -0 $worker 2>/dev/null; then wait $worker; rc=$?; fi",
        'echo "batchspec task ${SLURM_ARRAY_TASK_ID:-0} exit $rc $(date -Is)"',
        "exit $rc",
        "",
    ]
    return "\n".join(lines)


def _array_options(opts: SubmitOptions, out: OutDir) -> list[str]:
    """The array script's header: the array, its logs, requeue, the early-warning signal."""
    lines = [
        "#!/bin/bash",
        *_common_options(opts, opts.job_name or "batchspec", opts.time),
        f"#SBATCH --array=0-{int(opts.tasks) - 1}",
        f"#SBATCH --output={log_path(OUT_WHAT, out.slurm, '%A_%a.log')}",
        "#SBATCH --open-mode=append",
        # Requeued after node failure or preemption; the run resumes from its parts.
        "#SBATCH --requeue",
        # Early warning to the batch shell, which hands it to the worker: it stops claiming,
        # finishes or hands back its units, and exits 0 before the limit kills it.
        f"#SBATCH --signal=B:TERM@{int(opts.signal_lead_s)}",
    ]
    if opts.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{int(opts.gpus_per_task)}")
    if opts.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={int(opts.cpus_per_task)}")
    return lines + [f"#SBATCH {extra_option(x)}" for x in opts.extra]


def finisher_time(opts: SubmitOptions) -> str:
    """The finisher's ``--time``: ``FINISHER_TIME_S``, or the array's limit if shorter."""
    limit = _checked_time(opts.time) if opts.time else None
    seconds = min(limit or FINISHER_TIME_S, FINISHER_TIME_S)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def render_finisher(out: OutDir, opts: SubmitOptions) -> str:
    """The finisher's script: one small job, submitted to start once the array has ended
    (``--dependency=afterany:<array>``, given on sbatch's command line), that exits with
    the run's verdict (``batchspec status OUT --require-complete``), so that a pipeline can
    chain ``afterok`` on it. It takes the array's partition and account, no GPU, one CPU,
    and none of the extra options (they size the workers)."""
    name = f"{opts.job_name or 'batchspec'}-finisher"
    args = [sys.executable, "-m", "batchspec", "status", str(out.root), "--require-complete"]
    what = ["the Python interpreter's path", "", "", "", OUT_WHAT, ""]
    lines = [
        "#!/bin/bash",
        *_common_options(opts, name, finisher_time(opts)),
        f"#SBATCH --output={log_path(OUT_WHAT, out.slurm, '%j_finisher.log')}",
        "#SBATCH --open-mode=append",
        "#SBATCH --cpus-per-task=1",
        "",
        "# Written by `batchspec slurm submit`: runs once the array it follows has ended, and",
        "# exits with the run's verdict (0 complete, 3 units failed, 4 error rows, 5 incomplete).",
        "set -u",
        f"exec {_command(args, what)}",
        "",
    ]
    return "\n".join(lines)
