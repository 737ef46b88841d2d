"""What binds an output directory (``io/manifest.py``): unit ids unique by construction (a
legacy directory keeps its own, refused where they collide), the parts layout recorded once
and read by every reader and writer, a damaged manifest refused in one line, and a refused
resume that names the keys that differ. No engine starts."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import job_dict, write_job

from batchspec.cli import main
from batchspec.errors import UserError
from batchspec.io import layout
from batchspec.io.layout import FANOUT, FANOUT_MARK, FLAT, OutDir, layout_for
from batchspec.io.manifest import LEGACY, Manifest, check_bound, claim_output_dir, make_manifest
from batchspec.io.planner import check_unique_ids, plan_units
from batchspec.io.writer import Commit, PartWriter, output_schema
from batchspec.spec.file import load_spec
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work.indexes import DoneIndex
from batchspec.work.runlog import write_job_record

COLLIDING = ("customer_support_tickets/lang_3514", "customer_support_tickets/lang_4914")
"""Two domains whose legacy unit ids are one: alike in their first 24 slug characters, and
equal in the 24 bits of sha1 that followed (found by a birthday search over ~4,900 names)."""
SCHEMA = output_schema(pa.string(), {})


def domain_input(path: Path, domains: list[str | None], rows: int = 8) -> Path:
    """``rows`` rows whose domains cycle through ``domains``."""
    doms = [domains[i % len(domains)] for i in range(rows)]
    ids = [f"r{i}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "domain": doms, "prompt": ids}), path)
    return path


def result_for(unit: WorkUnit, inp: Path) -> UnitResult:
    """The unit's rows as an engine would return them: its own rows of the input."""
    table = pq.read_table(inp).slice(unit.start, unit.stop - unit.start).to_pylist()
    rows = [
        RowRequest(row=unit.start + i, row_id=r["id"], domain=r["domain"], passthrough={})
        for i, r in enumerate(table)
        if r["domain"] == unit.domain
    ]
    results = [RowResult(req, text="x", num_output_tokens=1) for req in rows]
    return UnitResult(UnitRequests(unit, rows), results, 0, "none", "vllm")


def bind(out: OutDir, parts_layout: str = FLAT, units: int = 2) -> Manifest:
    manifest = Manifest("h", "f", None, units, units, 0.0, "v", parts_layout=parts_layout)
    return claim_output_dir(out, manifest)


def bind_legacy(out: OutDir, version: str = "0.0.9") -> Manifest:
    """A manifest as a batchspec before the recorded layout and unit ids wrote it."""
    out.root.mkdir(parents=True, exist_ok=True)
    data = asdict(Manifest("h", "f", None, 2, 2, 0.0, version))
    out.manifest.write_text(json.dumps({k: v for k, v in data.items() if k not in LEGACY}))
    return claim_output_dir(out, Manifest("h", "f", None, 2, 2, 0.0, "new"))


def test_domains_alike_get_distinct_unit_ids_and_every_row_commits_once(tmp_path: Path) -> None:
    inp = domain_input(tmp_path / "in.parquet", list(COLLIDING))
    units = plan_units([inp], 8, "domain")
    assert len(units) == 2 and len({u.unit_id for u in units}) == 2
    assert len({replace(u, domain_index=None).unit_id for u in units}) == 1  # as before
    out = OutDir(tmp_path / "out")
    bind(out)
    writer = PartWriter(out, SCHEMA)
    assert [writer.commit(result_for(u, inp))[0] for u in units] == [Commit.COMMITTED] * 2
    ids = [i for p in out.part_files() for i in pq.read_table(p).column("id").to_pylist()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(8))


def test_a_plan_with_a_repeated_id_is_refused_in_one_line() -> None:
    units = [WorkUnit(0, "in.parquet", 0, 8, d, 4) for d in COLLIDING]  # legacy ids
    with pytest.raises(UserError) as exc:
        check_unique_ids(units, "plan", "fix it")
    msg = str(exc.value)
    assert "\n" not in msg and all(repr(d) in msg for d in COLLIDING)
    assert msg.startswith("plan: ") and units[0].unit_id in msg and msg.endswith("fix it")


def test_a_legacy_directory_keeps_its_ids_and_is_refused_where_two_collide(
    tmp_path: Path,
) -> None:
    inp = domain_input(tmp_path / "in.parquet", ["code", "chat"])
    out = OutDir(tmp_path / "out")
    manifest = bind_legacy(out)
    assert manifest.unit_ids is None and manifest.parts_layout is None
    units = manifest.named_units(out, plan_units([inp], 8, "domain"))
    old = [WorkUnit(0, str(inp), 0, 8, d, 4) for d in ("chat", "code")]
    assert [u.unit_id for u in units] == [u.unit_id for u in old]  # what its parts carry
    PartWriter(out, SCHEMA).commit(result_for(units[0], inp))
    assert out.committed_units() == {old[0].unit_id}  # a resume finds it done
    clash = domain_input(tmp_path / "clash.parquet", list(COLLIDING))
    with pytest.raises(UserError) as exc:
        manifest.named_units(out, plan_units([clash], 8, "domain"))
    msg = str(exc.value)
    assert "\n" not in msg and "written by batchspec 0.0.9" in msg and "--output DIR" in msg
    # A new directory of the same plan: ids of their own, no refusal.
    fresh = bind(OutDir(tmp_path / "new"))
    assert len({u.unit_id for u in fresh.named_units(out, plan_units([clash], 8, "domain"))}) == 2


def test_the_recorded_layout_decides_never_a_probe_of_the_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = domain_input(tmp_path / "in.parquet", [None], rows=16)
    units = plan_units([inp], 4, None)
    ids = [u.unit_id for u in units]
    out = OutDir(tmp_path / "out")
    out.parts.mkdir(parents=True)
    (out.parts / FANOUT_MARK).touch()  # even where a mark is there...
    bind(out, FANOUT, len(units))
    assert PartWriter(out, SCHEMA).commit(result_for(units[0], inp))[0] is Commit.COMMITTED
    assert out.part(ids[0]).parent.name == layout.bucket_of(ids[0])
    # ...a worker whose look for it says "absent" (a stale negative lookup on NFS, an older
    # rule) still commits and reads the fanned-out layout: its copy is discarded, not linked
    # under the flat name.
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: p.name != FANOUT_MARK and real_exists(p))
    other = OutDir(out.root)
    assert other.fanout
    assert PartWriter(other, SCHEMA).commit(result_for(units[0], inp))[0] is Commit.DISCARDED
    # Stray flat parts (copied in by hand) are never listed, so never read twice.
    shutil.copy(out.part(ids[0]), out.parts / f"{ids[0]}.parquet")
    shutil.copy(out.part(ids[0]), out.parts / f"{ids[1]}.parquet")
    fresh = OutDir(out.root)
    assert fresh.part_files() == [out.part(ids[0])] and fresh.committed_units() == {ids[0]}
    assert fresh.rows_committed() == 4
    done = DoneIndex(fresh)
    assert done.done(ids[0]) and not done.done(ids[1])
    assert [p.name for p in fresh.stray_parts()] == [f"{i}.parquet" for i in ids[:2]]
    bind(fresh, FANOUT, len(units))  # a run's start says so
    assert "2 part(s) outside the directory's fanout layout" in capsys.readouterr().err
    # A flat directory ignores a stray bucket the same way.
    flat = OutDir(tmp_path / "flat")
    bind(flat, FLAT, len(units))
    (flat.parts / "f0000-b000000").mkdir(parents=True)
    shutil.copy(out.part(ids[0]), flat.parts / "f0000-b000000" / f"{ids[0]}.parquet")
    assert flat.part_files() == [] and len(flat.stray_parts()) == 1


def test_a_run_records_its_layout_and_a_legacy_directory_keeps_the_mark_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "FANOUT_UNITS", 10)
    assert (layout_for(9), layout_for(10)) == (FLAT, FANOUT)
    inp = domain_input(tmp_path / "in.parquet", [None], rows=12)
    units = plan_units([inp], 1, None)
    spec = load_spec(write_job(tmp_path / "job.yaml", job_dict(tmp_path / "out")), [])
    out = OutDir(spec.output_dir)
    manifest = claim_output_dir(out, make_manifest(spec, [inp], None, units))
    assert manifest.parts_layout == FANOUT and OutDir(out.root).fanout
    assert not (out.parts / FANOUT_MARK).exists()  # nothing to probe: the manifest says
    # Legacy: the first run's choice, marked; a directory holding flat parts stays flat.
    old = OutDir(tmp_path / "old")
    bind_legacy(old)
    old.parts.mkdir()
    (old.parts / f"{units[0].unit_id}.parquet").write_bytes(b"part")
    old.choose_layout(12)
    assert not OutDir(old.root).fanout
    marked = OutDir(tmp_path / "marked")
    bind_legacy(marked)
    marked.choose_layout(12)
    assert OutDir(marked.root).fanout and (marked.parts / FANOUT_MARK).exists()


def cli(*args: str) -> tuple[int, list[str]]:
    """Exit code and the non-empty lines on stderr of ``batchspec ARGS``, in this process."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, [line for line in result.stderr.splitlines() if line.strip()]


WRONG_TYPE = json.dumps({**asdict(Manifest("h", "f", None, 2, 2, 0.0, "v")), "num_units": "2"})


@pytest.mark.parametrize(
    "text",
    ["", '{"spec_hash": "ab', "[]", WRONG_TYPE],
    ids=["empty", "truncated", "not-an-object", "wrong-type"],
)
def test_a_damaged_manifest_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(text)
    for args in (["report"], ["status"], ["status", "--json"], ["export", "--to", "ds"]):
        code, lines = cli(*args[:1], str(out), *args[1:])
        assert code == 2 and len(lines) == 1, (args, lines)
        assert "manifest.json: unreadable run manifest" in lines[0], lines[0]


def test_a_refused_resume_names_the_keys_that_differ(tmp_path: Path) -> None:
    inp = domain_input(tmp_path / "in.parquet", [None])
    units = plan_units([inp], 4, None)

    def spec(**sampling: object):
        job = job_dict(tmp_path / "out", sampling={"max_tokens": 64, **sampling})
        return load_spec(write_job(tmp_path / "job.yaml", job), [])

    out = OutDir(spec().output_dir)
    claim_output_dir(out, make_manifest(spec(), [inp], None, units))
    refused = "holds a run with a different job spec (sampling.max_tokens: 64 -> 128)"
    with pytest.raises(UserError, match=r"\(sampling\.max_tokens: 64 -> 128\); refusing"):
        check_bound(out, make_manifest(spec(max_tokens=128), [inp], None, units))
    changed = spec(max_tokens=128, temperature=0.5, top_p=0.5, top_k=7)
    with pytest.raises(UserError) as exc:
        check_bound(out, make_manifest(changed, [inp], None, units))
    assert "sampling.max_tokens: 64 -> 128, sampling.temperature: " in str(exc.value)
    assert ", and 1 more); refusing to mix them" in str(exc.value)
    # A legacy manifest holds no spec: the last run's job.json names the keys, if it hashes
    # to the manifest's spec hash.
    manifest = json.loads(out.manifest.read_text())
    out.manifest.write_text(json.dumps({k: v for k, v in manifest.items() if k not in LEGACY}))
    write_job_record(out, spec(), [inp], None)
    with pytest.raises(UserError) as exc:
        check_bound(out, make_manifest(spec(max_tokens=128), [inp], None, units))
    assert refused in str(exc.value)
