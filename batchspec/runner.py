"""The worker loop: plan, skip what is committed, generate the rest, commit unit by unit.

Data flows one way: spec -> preflight (checks, plan) -> prompt builder -> engine -> writer.
Everything a later run needs to know lives in the output directory (manifest, parts), so a
rerun picks up exactly the units that have no part yet.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from batchspec.checks import Preflight, preflight
from batchspec.engine import Engine
from batchspec.inputs import PromptBuilder, UnitRequests
from batchspec.manifest import claim_output_dir, make_manifest
from batchspec.planner import WorkUnit
from batchspec.spec import JobSpec
from batchspec.writer import commit_part, committed_units, output_schema, unit_table

RUNS_DIR = "runs"


@dataclass
class RunStats:
    """What one invocation did (the whole run's state is in the output directory)."""

    out_dir: str
    units_total: int
    units_skipped: int = 0
    units_committed: int = 0
    units_discarded: int = 0
    rows: int = 0
    error_rows: int = 0
    output_tokens: int = 0
    engine_build_s: float = 0.0
    engine_close_s: float = 0.0
    generate_s: float = 0.0
    wall_s: float = 0.0
    engines: list[dict] = field(default_factory=list)

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.generate_s if self.generate_s > 0 else None


def _group_by_k(spec: JobSpec, units: list[WorkUnit]) -> dict[int, list[WorkUnit]]:
    groups: dict[int, list[WorkUnit]] = {}
    for unit in units:
        groups.setdefault(spec.speculative.k_for(unit.domain), []).append(unit)
    return groups


def _load_tokenizer(pre: Preflight, spec: JobSpec):
    from transformers import AutoTokenizer

    path = spec.resolve(spec.model.tokenizer) if spec.model.tokenizer else pre.target_dir
    return AutoTokenizer.from_pretrained(str(path))


def run_job(spec: JobSpec, limit: int | None = None, progress: bool = True) -> RunStats:
    """Generate every unit of the job that has no committed part yet."""
    started = time.perf_counter()
    pre = preflight(spec, limit)
    out_dir = spec.output_dir
    claim_output_dir(out_dir, make_manifest(spec, pre.files, limit, pre.units))
    done = committed_units(out_dir)
    todo = [u for u in pre.units if u.unit_id not in done]
    stats = RunStats(str(out_dir), len(pre.units), units_skipped=len(pre.units) - len(todo))
    if not todo:
        stats.wall_s = time.perf_counter() - started
        return stats

    types = pre.column_types
    schema = output_schema(
        types[spec.input.id_column], {c: types[c] for c in spec.input.passthrough_columns}
    )
    tokenizer = _load_tokenizer(pre, spec)
    bar = tqdm(
        total=sum(u.num_rows for u in todo),
        unit="row",
        disable=not progress,
        dynamic_ncols=True,
        desc="generating",
    )
    try:
        for k, units in sorted(_group_by_k(spec, todo).items()):
            engine = Engine(spec, k)
            stats.engine_build_s += engine.build_s
            builder = PromptBuilder(spec.input, tokenizer, engine.max_model_len, spec.sampling.seed)

            def requests(
                units: list[WorkUnit] = units, builder: PromptBuilder = builder
            ) -> Iterator[UnitRequests]:
                for unit in units:
                    yield builder.build(unit)

            gen_started = time.perf_counter()
            tokens = 0
            try:
                for result in engine.run(requests()):
                    table = unit_table(result, schema)
                    unit_id = result.unit_requests.unit.unit_id
                    if commit_part(out_dir, unit_id, table):
                        stats.units_committed += 1
                    else:
                        stats.units_discarded += 1
                    n_tok = sum(r.num_output_tokens or 0 for r in result.results)
                    tokens += n_tok
                    stats.rows += len(result.results)
                    stats.error_rows += sum(r.error is not None for r in result.results)
                    bar.update(len(result.results))
            finally:
                gen_s = time.perf_counter() - gen_started
                engine.close()
                stats.engine_close_s += time.perf_counter() - gen_started - gen_s
            stats.generate_s += gen_s
            stats.output_tokens += tokens
            stats.engines.append(
                {
                    "method": engine.method,
                    "num_speculative_tokens": k,
                    "units": len(units),
                    "build_s": round(engine.build_s, 3),
                    "generate_s": round(gen_s, 3),
                    "output_tokens": tokens,
                }
            )
    finally:
        bar.close()
        stats.wall_s = time.perf_counter() - started
        _log_run(out_dir, stats)
    return stats


def _log_run(out_dir: Path, stats: RunStats) -> None:
    """One JSON file per invocation under runs/: what it did, for reports and debugging."""
    runs = out_dir / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{socket.gethostname()}-{os.getpid()}.json"
    data = asdict(stats) | {"output_tokens_per_s": stats.output_tokens_per_s}
    (runs / name).write_text(json.dumps(data, indent=2) + "\n")
