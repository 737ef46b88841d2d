"""The sbatch scripts without Slurm: no value from a job file or a flag adds a line, an option
or a command (refused in one line, or quoted for the reader of its line: bash for the body,
sbatch's own tokenizer for ``#SBATCH`` lines), and the finisher's script and submission.
The real cluster runs both scripts in test_slurm.py."""

from __future__ import annotations

import json
import random
import re
import shlex
import string
import sys
import unicodedata
from pathlib import Path

import pytest
from conftest import job_dict, write_job
from test_cli_errors import assert_user_error, cli

from batchspec.cluster.sbatch import (
    REFUSED_CATEGORIES,
    SubmitOptions,
    render_finisher,
    render_script,
)
from batchspec.errors import UserError
from batchspec.io.layout import OutDir

C_SPACE = " \t\n\v\f\r"


def sbatch_words(line: str, quotes: str) -> list[str]:
    """The words sbatch reads on an ``#SBATCH`` line (src/sbatch/opt.c ``_get_argument``):
    ``quotes='"'`` as Slurm before 19.05 reads it (double quotes only, ``#`` a comment even
    inside them), ``quotes='"\\''`` as later versions do (both quotes, ``#`` literal inside)."""
    assert line.startswith("#SBATCH")
    text, i, words = line[len("#SBATCH") :], 0, []
    while True:
        while i < len(text) and text[i] in C_SPACE:
            i += 1
        if i == len(text) or text[i] == "#":
            return words
        word, quote, escaped = [], "", False
        while i < len(text) and (quote or text[i] not in C_SPACE):
            c = text[i]
            i += 1
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
                continue
            elif quote and len(quotes) > 1 and c == quote:
                quote = ""
                continue
            elif c in quotes and (not quote or len(quotes) == 1):
                quote = "" if quote else c
                continue
            elif c == "#":  # a comment, even inside quotes where quotes == '"'
                return [*words, "".join(word)]
            word.append(c)
        assert not quote, f"unmatched quote in {line!r}"
        words.append("".join(word))


def read_sbatch(line: str) -> str:
    """The one word of an ``#SBATCH`` line, read alike by old and new sbatch."""
    old, new = sbatch_words(line, '"'), sbatch_words(line, "\"'")
    assert old == new and len(new) == 1, (line, old, new)
    return new[0]


def job_yaml(tmp_path: Path, **top: object) -> Path:
    """The test job with top-level keys (``name``) set as given."""
    job = job_dict(tmp_path / "out") | top
    return write_job(tmp_path / "job.yaml", job)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--partition", "a\nc"], "--partition"),
        (["--partition", "a b"], "--partition"),
        (["--account", "x\ny"], "--account"),
        (["--", "--qos=x\nrm -rf y"], "--qos"),
        (["--", "--wrap=id"], "--wrap"),
    ],
)
def test_an_injection_through_a_flag_is_refused(tmp_path: Path, args, field) -> None:
    result = cli("slurm", "submit", str(job_yaml(tmp_path)), "--dry-run", *args)
    assert_user_error(result, field)
    assert "#SBATCH" not in result.stdout and not (tmp_path / "out").exists()


def test_a_time_with_a_newline_is_refused_as_no_slurm_time(tmp_path: Path) -> None:
    """--time is a click option with a check of its own: click's usage error, exit 2. (It
    once stripped the value before checking it, then wrote it as given.)"""
    result = cli("slurm", "submit", str(job_yaml(tmp_path)), "--dry-run", "--time", "4:00\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Invalid value for '--time': '4:00\\n' is not a Slurm time" in result.stderr
    assert "#SBATCH" not in result.stdout


def test_a_job_name_with_a_newline_is_refused(tmp_path: Path) -> None:
    job = job_yaml(tmp_path, name="evil\n#SBATCH --wrap=id\nrm -rf x")
    result = cli("slurm", "submit", str(job), "--dry-run")
    assert_user_error(result, "name")
    assert "rm -rf" not in result.stdout and not (tmp_path / "out").exists()


def test_an_output_dir_with_a_newline_is_refused(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", job_dict(tmp_path / "o\n#SBATCH --wrap=id"))
    result = cli("slurm", "submit", str(job), "--dry-run")
    assert_user_error(result, "output.dir (or --output)", "U+000A")
    assert "#SBATCH" not in result.stdout
    out = OutDir(tmp_path / "o\n#SBATCH --wrap=id")
    with pytest.raises(UserError, match=r"output.dir \(or --output\).*U\+000A"):
        render_script(Path("/j.yaml"), out, [], SubmitOptions(), 1)
    with pytest.raises(UserError, match=r"output.dir \(or --output\).*U\+000A"):
        render_finisher(out, SubmitOptions())


SAFE_WORD = string.ascii_letters + string.digits + "._+-"
ALPHABET = string.printable + "é\u00a0\u0085\u2028\u200b\U0001f600"
"""What the fuzz test draws from: every printable ASCII character, ASCII whitespace and
control characters, and a few others (a non-breaking space, NEL, a line separator, a
zero-width space, an emoji)."""
FIELDS = ["name", "partition", "account", "time", "extra", "out", "job", "set"]


def render(values: dict[str, str], base: Path) -> tuple[str, str, dict[str, str]]:
    """Both scripts for these values; returns them and the words each value-bearing line
    must read as (``#SBATCH`` option -> its word; ``run``/``status`` -> the command)."""
    opts = SubmitOptions(
        tasks=3,
        cpus_per_task=2,
        partition=values["partition"],
        time=values["time"],
        account=values["account"],
        job_name=values["name"],
        extra=["--exclusive", f"--comment={values['extra']}"],
    )
    out = OutDir(base / values["out"])
    job = Path("/jobs") / values["job"]
    run_args = [f"--set={values['set']}", "--limit", "7"]
    script = render_script(job, out, run_args, opts, 2)
    finisher = render_finisher(out, opts)
    log_dir = str(out.slurm).replace("%", "%%")
    expected = {
        "--job-name": f"--job-name={values['name']}",
        "--partition": f"--partition={values['partition']}",
        "--account": f"--account={values['account']}",
        "--time": f"--time={values['time']}",
        "--comment": f"--comment={values['extra']}",
        "--output": f"--output={log_dir}/%A_%a.log",
        "run": shlex.join(
            [sys.executable, "-m", "batchspec", "run", str(job), "--output", str(out.root)]
        )
        + " "
        + shlex.join([*run_args, "--workers", "2"]),
        "status": shlex.join(
            [sys.executable, "-m", "batchspec", "status", str(out.root), "--require-complete"]
        ),
    }
    return script, finisher, expected


def check_lines(script: str, baseline: str, expected: dict[str, str], finisher: bool) -> None:
    """Line for line as the baseline's, each value-bearing line read as ``expected``."""
    lines, base = script.split("\n"), baseline.split("\n")
    assert len(lines) == len(base), script
    for line, fixed in zip(lines, base, strict=True):
        if line.startswith("#SBATCH"):
            option = fixed.split("=")[0].removeprefix("#SBATCH ")
            assert line.startswith(f"#SBATCH {option}"), (line, fixed)
            word = read_sbatch(line)
            want = expected.get(option, read_sbatch(fixed))
            if finisher and option == "--output":
                want = want.replace("%A_%a.log", "%j_finisher.log")
            elif finisher and option == "--job-name":
                want += "-finisher"
            elif finisher and option == "--time":  # its own limit, from the array's
                assert re.fullmatch(r"--time=\d+:\d\d:\d\d", word), line
                continue
            assert word == want, (line, want)
        elif " -m batchspec " in fixed:
            command = line.removeprefix("exec ").removesuffix(" &")
            kind = "status" if finisher else "run"
            assert shlex.split(command) == shlex.split(expected[kind]), line
        else:
            assert line == fixed


def test_random_printable_values_never_make_a_line(tmp_path: Path) -> None:
    """For each field, random values from ``ALPHABET``: a control character anywhere is
    refused naming the field; a value that is rendered reads back as itself, and both
    scripts keep exactly the baseline's lines."""
    safe = {f: "v" for f in FIELDS} | {"time": "4:00:00"}
    baseline = render(safe, tmp_path)
    rng = random.Random(33)
    rendered = refused = 0
    for _ in range(400):
        field = rng.choice(FIELDS)
        value = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 10)))
        values = safe | {field: value}
        control = any(unicodedata.category(c) in REFUSED_CATEGORIES for c in value)
        try:
            script, finisher, expected = render(values, tmp_path)
        except UserError as exc:
            refused += 1
            assert field not in ("extra", "job", "set", "out") or control or "\\" in value, exc
            continue
        assert not control, (field, value)
        rendered += 1
        check_lines(script, baseline[0], expected, finisher=False)
        check_lines(finisher, baseline[1], expected, finisher=True)
    assert rendered > 100 and refused > 100, (rendered, refused)


def test_values_of_the_safe_charsets_are_taken_as_they_are(tmp_path: Path) -> None:
    rng = random.Random(7)
    for _ in range(100):
        name = "".join(rng.choice(SAFE_WORD) for _ in range(rng.randint(1, 12)))
        partition = ",".join(name.replace("+", "_")[: rng.randint(1, len(name))] for _ in "ab")
        values = {f: "v" for f in FIELDS} | {"name": name, "account": name, "time": "1-2:30"}
        script, _, _ = render(values | {"partition": partition}, tmp_path)
        assert f"#SBATCH --job-name={name}\n" in script
        assert f"#SBATCH --partition={partition}\n#SBATCH --account={name}\n" in script


def test_values_that_need_quoting_are_quoted_for_sbatch(tmp_path: Path) -> None:
    opts = SubmitOptions(extra=["--comment=two words #1 \"q\" 's'", "-Cgpu&nvlink", "--exclusive"])
    out = OutDir(tmp_path / "runs 100% #2")
    script = render_script(Path("/j.yaml"), out, [], opts, 1)
    lines = script.splitlines()
    comment = "#SBATCH --comment=" + r'"two words \#1 \"q\" ' + "'s'\""
    assert comment in lines and read_sbatch(comment) == opts.extra[0]
    assert '#SBATCH -C"gpu&nvlink"' in lines and "#SBATCH --exclusive" in lines
    output = next(line for line in lines if line.startswith("#SBATCH --output"))
    assert read_sbatch(output) == f"--output={tmp_path}/runs 100%% #2/slurm/%A_%a.log"
    for bad, why in [
        ("hetjob", "erases"),
        ("-- --qos=x", "not an option"),
        ("qos=x", "not an option"),
    ]:
        with pytest.raises(UserError, match=why):
            render_script(Path("/j.yaml"), out, [], SubmitOptions(extra=[bad]), 1)
    with pytest.raises(UserError, match="backslash"):
        render_script(Path("/j.yaml"), OutDir(tmp_path / "a\\b"), [], opts, 1)


def test_the_finisher_follows_the_array_and_gives_the_verdict(tmp_path: Path) -> None:
    """Printed after the array's script with --dry-run, left out with --no-finisher."""
    job = job_yaml(tmp_path)
    flags = ["--partition", "gpu", "--account", "proj", "--time", "10", "--gpus-per-task", "1"]
    result = cli("slurm", "submit", str(job), "--dry-run", *flags, "--", "--mem=64G")
    assert result.returncode == 0, result.stderr
    array, separator, finisher = result.stdout.partition("# ---- the finisher's script")
    assert separator and "#SBATCH --mem=64G" in array and "--require-complete" not in array
    lines = finisher.splitlines()[1:]
    assert lines[0] == "#!/bin/bash" and "#SBATCH --job-name=synth_data-finisher" in lines
    assert {"#SBATCH --partition=gpu", "#SBATCH --account=proj"} <= set(lines)
    assert "#SBATCH --time=0:10:00" in lines  # the array's limit, being shorter than 30 min
    assert not any(x in "\n".join(lines) for x in ("--mem", "--gres", "--array", "--dependency"))
    out = tmp_path / "out"
    assert lines[-1] == f"exec {sys.executable} -m batchspec status {out} --require-complete"
    alone = cli("slurm", "submit", str(job), "--dry-run", "--no-finisher")
    assert alone.returncode == 0 and "--require-complete" not in alone.stdout
    assert not out.exists()


def fake_sbatch(tmp_path: Path, fail_on: int = 0) -> Path:
    """An ``sbatch`` that logs its arguments and prints job ids 101, 102, ...; call
    ``fail_on`` is refused."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {log}\n'
        f"n=$(/usr/bin/wc -l < {log})\n"
        f'if [ "$n" = {fail_on} ]; then echo "sbatch: error: Invalid account" >&2; exit 1; fi\n'
        'echo "$((100 + n));cluster"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir


def test_submit_chains_the_finisher_on_the_array_and_records_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_sbatch(tmp_path)))
    result = cli("slurm", "submit", str(job_yaml(tmp_path)), "--tasks", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("submitted job 101: 2 tasks")
    assert lines[1].startswith("finisher job 102: starts once job 101 has ended")
    assert lines[-1] == "101"  # the array's id, last, as before
    calls = (tmp_path / "sbatch.log").read_text().splitlines()
    assert calls[0].startswith("--parsable ") and calls[0].endswith(".sbatch")
    assert calls[1].startswith("--parsable --dependency=afterany:101 ")
    assert calls[1].endswith("-finisher.sbatch")
    jobs = [json.loads(x) for x in (tmp_path / "out/slurm/jobs.jsonl").read_text().splitlines()]
    assert [(j["job_id"], j["role"], j.get("after")) for j in jobs] == [
        ("101", "array", None),
        ("102", "finisher", "101"),
    ]
    status = cli("slurm", "status", str(tmp_path / "out"))
    assert "slurm job 102 finisher: no longer known" in status.stdout, status.stdout


def test_a_refused_finisher_says_the_array_is_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_sbatch(tmp_path, fail_on=2)))
    result = cli("slurm", "submit", str(job_yaml(tmp_path)))
    assert_user_error(result, "job 101 is queued, but its finisher is not", "Invalid account")
    assert "--require-complete" in result.stderr
