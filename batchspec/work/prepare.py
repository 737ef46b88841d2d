"""Before any worker starts: every check a run makes, and the output directory bound to it.

``validate`` and ``slurm submit --dry-run`` run ``check_run`` too, so what they pass a run
accepts; ``prepare_run`` then writes: the manifest (first writer wins), the job record, the
staged input, and it lists the work left. One worker (``run``) or a launcher of several
(``run --workers N``) calls it once before the work.
"""

from __future__ import annotations

from batchspec.io.checks import Preflight, preflight
from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, check_bound, claim_output_dir, make_manifest
from batchspec.io.temps import check_commits, clean_stale_temps
from batchspec.io.writer import units_with_errors
from batchspec.spec import JobSpec
from batchspec.speculation.route import route_job
from batchspec.speculation.tuning import job_tuning
from batchspec.units import WorkUnit
from batchspec.work.runlog import write_job_record


def check_run(spec: JobSpec, limit: int | None) -> tuple[Preflight, Manifest, JobSpec]:
    """Everything a run checks before it writes anything; ``validate`` and ``slurm submit
    --dry-run`` run it too, so what they pass a run accepts. Returns the preflight, the
    manifest the run binds the output directory to, and the job on the engine it runs on
    (``route_job``: routed here, once)."""
    pre = preflight(spec, limit)
    out = OutDir(spec.output_dir)
    job_tuning(spec, out)  # a tuning file of another job: refused before any worker starts
    routed = route_job(spec, out)  # engine auto without a route for this batch size: refused
    manifest = make_manifest(spec, pre.files, limit, pre.units)
    check_bound(out, manifest)  # a directory bound to another spec, input or --limit
    return pre, manifest, routed


def prepare_run(
    spec: JobSpec, limit: int | None, retry_errors: bool = False
) -> tuple[Preflight, list[WorkUnit], set[str], JobSpec]:
    """Check everything, bind the output directory to this run, and list the work left:
    uncommitted units, plus (``retry_errors``) committed units that hold error rows; and the
    job on the engine it runs on (``check_run``)."""
    pre, manifest, routed = check_run(spec, limit)
    out = OutDir(spec.output_dir)
    out.root.mkdir(parents=True, exist_ok=True)
    check_commits(out.root)  # a filesystem where two committers could both win: refused
    bound = claim_output_dir(out, manifest)  # with the parts layout it records
    pre.units = bound.named_units(out, pre.units)  # ids as its parts carry them (legacy)
    clean_stale_temps(out)
    done = out.committed_units()
    errors = units_with_errors(out) if retry_errors else set()
    todo = [u for u in pre.units if u.unit_id not in done or u.unit_id in errors]
    write_job_record(out, spec, pre.files, limit)
    pre.reader.stage(out, todo)  # input files with large row groups, once per output dir
    return pre, todo, errors, routed
