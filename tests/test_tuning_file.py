"""The tuning file, typed: a file as ``batchspec tune`` has written it is read and written back
unchanged, and a file batchspec cannot use is one line naming it. No engine starts."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from conftest import job_dict, write_job
from test_cli_errors import assert_user_error, cli

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec.file import load_spec
from batchspec.speculation.estimator import Observation
from batchspec.speculation.tuning import TUNING_VERSION, read_tuning, write_tuning


def domain(chosen: int, rates: dict[str, float], alpha: float | None) -> dict[str, Any]:
    return {
        "chosen_k": chosen,
        "best_measured_k": int(max(rates, key=rates.__getitem__)),
        "alpha": alpha,
        "alpha_std": None if alpha is None else 0.05,
        "tokens_per_s": rates,
        "noise_tokens_per_s": {k: r / 20 for k, r in rates.items()},
        "wall_tokens_per_s": {k: r * 0.9 for k, r in rates.items()},
    }


def engine(rates: dict[str, float], build_s: float) -> dict[str, Any]:
    """One engine's entry as ``tune`` wrote it: K keys as strings (JSON's keys), a domain
    without a domain column (``"None"``), observations as ``asdict`` gave them."""
    observations = [
        asdict(Observation(d, k, 4, rows=4, output_tokens=64, running_s=2.0, rated=4))
        for d in ("code", None)
        for k in (0, 3)
    ]
    domains = {"code": domain(3, rates, 0.6), "None": domain(0, rates, None)}
    return {
        "k_grid": [0, 3],
        "sample_rows": {"4": 4},
        "batches": [{"batch": 4, "domains": domains, "observations": observations}],
        "engine_build_s": build_s,
    }


def as_tune_wrote_it() -> dict[str, Any]:
    """A tuning file of an ``engine: auto`` job, key for key as ``batchspec tune`` wrote it
    before the file was typed (no ``version``)."""
    return {
        "method": "ngram",
        "identity": {"model.model": "builtin:smollm2-135m-instruct", "sampling.max_tokens": 16},
        "spec_hash": "0123456789abcdef",
        "created": 1764500000.25,
        "engines": {
            "vllm": engine({"0": 40.0, "3": 55.5}, 30.5),
            "tree": engine({"0": 44.0, "3": 61.0}, 2.5),
        },
        "route": [
            {
                "batch": 4,
                "engine": "tree",
                "tokens_per_s": {"vllm": 50.0, "tree": 60.0},
                "noise": {"vllm": 1.5, "tree": 2.0},
            }
        ],
    }


def test_a_file_tune_wrote_is_read_typed_and_written_back_unchanged(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps(as_tune_wrote_it(), indent=2) + "\n")
    tuning = read_tuning(old)
    assert tuning is not None and tuning.version == TUNING_VERSION
    vllm = tuning.engines["vllm"]
    assert vllm.engine_build_s == 30.5 and vllm.sample_rows == {4: 4}
    code = vllm.at(4).domains["code"]
    assert code.tokens_per_s == {0: 40.0, 3: 55.5} and code.chosen_k == 3
    assert vllm.at(8) is None
    (ob, *_) = tuning.observations(4, "tree")
    assert isinstance(ob, Observation) and (ob.domain, ob.k, ob.rows) == ("code", 0, 4)
    assert tuning.observations(8, "tree") == [] and tuning.observations(4, "sglang") == []
    assert tuning.route is not None and tuning.route[0].engine == "tree"
    new = tmp_path / "new.json"
    write_tuning(new, tuning)
    assert json.loads(new.read_text()) == {"version": TUNING_VERSION, **as_tune_wrote_it()}
    # A job on one engine has no route, and its file none either.
    tuning.route = None
    write_tuning(new, tuning)
    assert "route" not in json.loads(new.read_text())
    assert read_tuning(tmp_path / "missing.json") is None


DROP = object()
"""``at``'s value that removes the key."""


def at(keys: list[Any], value: Any) -> dict[str, Any]:
    """The file ``tune`` wrote with one value set (or ``DROP``ped) at this key path."""
    data = copy.deepcopy(as_tune_wrote_it())
    node = data
    for key in keys[:-1]:
        node = node[key]
    if value is DROP:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


OLDER = "made by an older batchspec tune (no engines recorded)"
BAD = [
    ("{not json", "not JSON"),
    ([], OLDER),
    (at(["engines"], DROP), OLDER),
    (at(["version"], 2), "tuning file version 2, made by a newer batchspec"),
    (at(["version"], "1"), "tuning file version '1'; this batchspec reads version 1"),
    (at(["engines", "vllm", "batches"], DROP), "(engines.vllm.batches: Field required"),
    (at(["engines", "sglang"], {}), "(engines.sglang.[key]: Input should be 'vllm' or 'tree'"),
    (at(["route", 0, "engine"], "gpu"), "(route.0.engine: Input should be 'vllm' or 'tree'"),
    (
        at(["engines", "tree", "batches", 0, "domains", "code", "tokens_per_s"], {"3.5": 1.0}),
        "(engines.tree.batches.0.domains.code.tokens_per_s.3.5.[key]: Input should be a valid",
    ),
]


@pytest.mark.parametrize(("change", "said"), BAD)
def test_a_file_batchspec_cannot_use_is_one_line_naming_it(
    tmp_path: Path, change: Any, said: str
) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(change if isinstance(change, str) else json.dumps(change))
    with pytest.raises(UserError) as caught:
        read_tuning(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    assert said in message and message.endswith("run batchspec tune again, or remove the file")


def test_an_unreadable_tuning_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.mkdir()
    with pytest.raises(UserError, match=rf"^{path}: cannot read the tuning file \("):
        read_tuning(path)


def test_validate_and_report_on_a_broken_tuning_file(tmp_path: Path) -> None:
    """``validate`` refuses it (the run would read it) in one line; ``report`` still shows
    the run's own units, without it."""
    job = write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out"))
    out = OutDir(load_spec(job).output_dir)
    out.root.mkdir()
    out.tuning.write_text('{"engines": {"vllm": {"k_grid": "all"}}}')
    assert_user_error(cli("validate", str(job)), "tuning.json: not a tuning file (engines.vllm")
    report = cli("report", str(out.root))
    assert report.returncode == 0, report.stderr
