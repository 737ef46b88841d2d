"""Commands on output directories and on Slurm: one rule for what an output directory is
(``status``, ``report``, ``export`` agree), and ``slurm submit`` checks before it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, bind_output_dir, cli

from batchspec.cluster.slurm import time_limit_s
from batchspec.io.layout import OutDir

LOOKERS = [
    "status {out}",
    "status {out} --json",
    "report {out}",
    "slurm status {out}",
    "export {out} --to {out}/../ds",
]
"""The commands that look at an output directory, and how each is called."""


@pytest.mark.parametrize("words", LOOKERS)
@pytest.mark.parametrize("content", ["empty", "foreign"])
def test_a_directory_batchspec_did_not_write_is_refused_alike(
    tmp_path: Path, words: str, content: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    if content == "foreign":
        (out / "data.csv").write_text("a,b\n1,2\n")
        (out / "parts").mkdir()
    result = cli(*words.format(out=out).split())
    assert_user_error(result, str(out), "no batchspec run here", "not an output directory")
    assert not (tmp_path / "ds").exists()


def test_a_bound_directory_with_nothing_committed_says_so(job_file) -> None:
    out = bind_output_dir(job_file(), None).root
    status = cli("status", str(out))
    assert status.returncode == 0, status.stderr
    assert "units: 0/48 done" in status.stdout and "rows: 0/360 committed" in status.stdout
    report = cli("report", str(out))
    assert report.returncode == 0, report.stderr
    assert f"{out}: 0 rows committed" in report.stdout and "(no rows committed)" in report.stdout


def test_a_tuned_directory_before_its_first_run_is_not_started(tmp_path: Path) -> None:
    out = OutDir(tmp_path / "out")
    out.root.mkdir()
    out.tuning.write_text("{}")
    status = cli("status", str(out.root))
    assert status.returncode == 0, status.stderr
    assert (
        status.stdout.strip()
        == f"{out.root}: not started (tuned by batchspec tune; no run has bound it yet)"
    )
    doc = json.loads(cli("status", str(out.root), "--json").stdout)
    assert doc["state"] == "not started" and doc["units"]["total"] == 0
    report = cli("report", str(out.root))
    assert report.returncode == 0 and "0 rows committed" in report.stdout


def test_slurm_submit_without_sbatch_writes_nothing(
    job_file, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    result = cli("slurm", "submit", str(job_file()), "--tasks", "2")
    assert_user_error(result, "sbatch not found")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--time", "banana"], "Invalid value for '--time': 'banana' is not a Slurm time"),
        (["--time", "1:2:3:4"], "is not a Slurm time"),
        (
            ["--time", "2", "--signal-lead", "120"],
            "--signal-lead 120 must be shorter than --time 2",
        ),
        (["--qos", "high"], "'high' is not an sbatch option"),
    ],
)
def test_slurm_submit_refuses_bad_options(job_file, tmp_path: Path, args, needle) -> None:
    result = cli("slurm", "submit", str(job_file()), "--dry-run", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert needle in result.stderr
    assert not (tmp_path / "out").exists()


def test_slurm_time_formats() -> None:
    cases = {
        "30": 1800,
        "30:15": 1815,
        "4:00:00": 14400,
        "2-12": (2 * 24 + 12) * 3600,
        "1-2:30": 26 * 3600 + 1800,
        "1-02:30:10": 26 * 3600 + 1810,
        "UNLIMITED": None,
        "infinite": None,
        "0": None,
    }
    assert {t: time_limit_s(t) for t in cases} == cases
    for bad in ("banana", "", "1-", "-5", "1:2:3:4", "1-2-3", "4h"):
        with pytest.raises(ValueError, match="is not a Slurm time"):
            time_limit_s(bad)


@pytest.mark.parametrize("value", ["-5", "0"])
def test_status_lease_timeout_must_be_positive(job_file, value: str) -> None:
    out = bind_output_dir(job_file(), None).root
    for words in (["status"], ["slurm", "status"]):
        result = cli(*words, str(out), "--lease-timeout", value)
        assert result.returncode == 2 and "'--lease-timeout'" in result.stderr


def test_an_output_path_is_taken_as_it_is_typed(tmp_path: Path) -> None:
    """--output reaches the spec as a --set value, which is YAML: a path holding ': ', '#'
    or starting with '[' was read as a mapping, a comment or a list."""
    from batchspec.cli.common import load_job

    root = Path(__file__).resolve().parent.parent
    for name in ("a: b #c", "[x]", "'quoted'"):
        spec = load_job(str(root / "jobs" / "synth_data.yaml"), (), str(tmp_path / name))
        assert spec.output_dir == tmp_path / name
