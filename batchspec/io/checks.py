"""Pre-flight checks: everything that can be wrong with a job, found before an engine starts.

``batchspec validate`` runs them and prints what it found; ``batchspec run`` runs them first
too, so that a typo in a column name costs a second, not an engine start. What is suspicious
but may be meant (a ``per_domain`` entry for a domain the input lacks) is a warning on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchspec.errors import UserError
from batchspec.io.convert import Staging, staged_files
from batchspec.io.ids import check_ids
from batchspec.io.inputs import check_columns
from batchspec.io.layout import OutDir
from batchspec.io.model_checks import check_context, check_draft, check_parallel
from batchspec.io.planner import plan_units
from batchspec.io.reader import UnitReader, required_columns
from batchspec.io.sources import Source, input_sources
from batchspec.io.writer import RESERVED
from batchspec.models import BUILTIN_PREFIX, load_tokenizer, resolve_model
from batchspec.spec import JobSpec
from batchspec.spec.sampling import TREE_UNSUPPORTED
from batchspec.spec.tree import TREE, VLLM
from batchspec.units import WorkUnit

# Texts a draft and its target must encode identically: prose, code, digits, non-ASCII.
TOKENIZER_SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # 42\n",
    "Le café coûte 3,50 € — ¿cuánto cuesta en Zürich? 東京",
    "  leading spaces, tabs\tand\nnewlines 1234567890",
]


@dataclass
class Preflight:
    """What the checks established, for the run (and for validate to print)."""

    files: list[Path]
    column_types: dict[str, pa.DataType]
    units: list[WorkUnit]
    target_dir: Path
    tokenizer_dir: Path
    """The target's tokenizer: ``model.tokenizer``, else the target's own."""
    draft_dir: Path | None
    reader: UnitReader
    """Reads the planned units' rows; ``run`` stages the input through it (``stage``)."""
    warnings: list[str]
    """Suspicious but allowed, already printed on stderr."""

    @property
    def num_rows(self) -> int:
        return sum(u.num_rows for u in self.units)

    def domains(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for u in self.units:
            counts[u.domain] = counts.get(u.domain, 0) + u.num_rows
        return counts


def compare_tokenizers(target: Any, draft: Any) -> str | None:
    """None when the draft tokenizes exactly like the target; else the first difference."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if t_by_id.get(i) != d_by_id.get(i):
            return (
                f"vocabularies differ first at token id {i}: target {t_by_id.get(i)!r}, "
                f"draft {d_by_id.get(i)!r} (sizes {len(tv)} and {len(dv)})"
            )
    for text in TOKENIZER_SAMPLES:
        a, b = target(text)["input_ids"], draft(text)["input_ids"]
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            pos = min(len(a), len(b)) if pos is None else pos
            ta = target.convert_ids_to_tokens(a[pos]) if pos < len(a) else None
            tb = draft.convert_ids_to_tokens(b[pos]) if pos < len(b) else None
            return f"{text!r} encodes differently from token {pos}: target {ta!r}, draft {tb!r}"
    if target.eos_token_id != draft.eos_token_id:
        return f"eos token ids differ: target {target.eos_token_id}, draft {draft.eos_token_id}"
    return None


def preflight(spec: JobSpec, limit: int | None = None) -> Preflight:
    """Check spec, output directory, input files, columns, ids, models and draft tokenizer;
    plan the units."""
    inp = spec.input
    check_output_dir(spec.output_dir)
    sources = input_sources(spec)
    check_output_apart(spec, [s.path for s in sources])
    models = check_models(spec) if inp.format == "openai-batch" else None  # bodies name one
    made = any(s.staged for s in sources) and not spec.output_dir.exists()
    try:
        files = stage_input(spec, sources, models[0] if models else None)
        return _checked(spec, files, models, limit)
    except UserError:
        if made:  # refused: the output directory staging made goes, as if never written
            shutil.rmtree(spec.output_dir, ignore_errors=True)
        raise


def _checked(
    spec: JobSpec,
    files: list[Path],
    models: tuple[Path, Path, Path | None] | None,
    limit: int | None,
) -> Preflight:
    """``preflight``'s checks of the Parquet files the job reads (staged or not)."""
    inp = spec.input
    types = check_columns(files, inp, spec.sampling)
    clash = sorted(RESERVED.intersection(inp.passthrough_columns))
    if clash:
        raise UserError(
            f"input.passthrough_columns: {clash[0]!r} is an output column name; "
            "rename it in the input or leave it out"
        )
    target, tok_dir, draft = models or check_models(spec)
    units = plan_units(files, spec.output.unit_rows, inp.domain_column, limit)
    if not units:
        raise UserError(f"input.path: {inp.path} holds no rows")
    check_ids(files, inp.id_column, limit)
    reader = UnitReader(inp, spec.output.unit_rows, units, spec.sampling)
    warnings = domain_warnings(spec, units, limit)
    for warning in warnings:
        print(f"batchspec: warning: {warning}", file=sys.stderr)
    return Preflight(files, types, units, target, tok_dir, draft, reader, warnings)


def stage_input(spec: JobSpec, sources: list[Source], target: Path | None) -> list[Path]:
    """The Parquet files the job reads: its Parquet sources as they are, the others staged
    once into the output directory (``io/convert.py``); ``target``: the job's model, which an
    OpenAI batch request may name."""
    if not any(s.staged for s in sources):
        return [s.path for s in sources]
    how = Staging(
        spec.input,
        spec.sampling,
        spec.output.unit_rows,
        required_columns(spec.input, spec.sampling),
        models=_model_names(spec.model.model, target) if target else [],
        refused=list(TREE_UNSUPPORTED) if spec.speculative.engine != VLLM else [],
    )
    files, _ = staged_files(OutDir(spec.output_dir), sources, how)
    return files


def _model_names(model: str, target: Path) -> list[str]:
    """What a request's ``model`` may say to mean the job's model: as the job names it, its
    directory, the directory's name, an embedded model's name without ``builtin:``."""
    names = [model, str(target), target.name, model.removeprefix(BUILTIN_PREFIX)]
    return list(dict.fromkeys(names))


def check_models(spec: JobSpec) -> tuple[Path, Path, Path | None]:
    """The target's, its tokenizer's and the draft's directories, checked: the job against
    their configs (``model_checks``), then the draft's tokenizer against the target's."""
    base = spec.resolve(".")
    target = resolve_model(spec.model.model, "model.model", base, auto_prepare=True)
    tok_dir = (
        resolve_model(spec.model.tokenizer, "model.tokenizer", base)
        if spec.model.tokenizer
        else target
    )
    check_context(spec, target, tok_dir)
    check_parallel(spec, target)
    draft = None
    s = spec.speculative
    if s.method != "none" and s.model:
        draft = resolve_model(s.model, "speculative.model", base, auto_prepare=True)
    check_draft(spec, target, draft)
    # EAGLE/MTP heads carry no tokenizer of their own; a full draft model must match.
    if draft and (s.method == "draft_model" or (draft / "tokenizer_config.json").exists()):
        diff = compare_tokenizers(
            load_tokenizer(tok_dir, "model.tokenizer"),
            load_tokenizer(draft, "speculative.model"),
        )
        if diff:
            raise UserError(f"speculative.model: tokenizer differs from the target's: {diff}")
    if s.tree is not None and s.tree.draft_layers is not None:
        check_draft_layers(s.tree.draft_layers, draft or target)
    if s.engine != TREE and importlib.util.find_spec("vllm") is None:
        # A CUDA machine may have torch and transformers only: the tree engine runs there.
        raise UserError(
            f"speculative.engine: {s.engine} needs vLLM, which is not installed here "
            "(install it, or set speculative.engine to tree)"
        )
    return target, tok_dir, draft


def check_output_apart(spec: JobSpec, files: list[Path]) -> None:
    """The output directory must not hold the input, nor lie where the input's directory or
    ``**`` glob would find its parts: the next plan would read them as input."""
    out = spec.output_dir.resolve()
    for path in files:
        if out in path.resolve().parents:
            raise UserError(
                f"output.dir: {out} holds the input file {path}; write the output elsewhere"
            )
    raw = spec.input.path
    root = spec.resolve(raw)
    if any(ch in raw for ch in "*?["):
        if "**" not in raw:
            return  # a pattern of one level does not reach into a folder below
        root = next(p for p in root.parents if not any(ch in str(p) for ch in "*?["))
    elif not root.is_dir():
        return
    if out == root or root in out.parents:
        raise UserError(
            f"output.dir: {out} lies inside input.path {raw}, which would read its parts as "
            "input; write the output elsewhere"
        )


def check_output_dir(path: Path) -> None:
    """``output.dir`` must be a directory this process can create and write in, found here
    rather than as a traceback from the run's first write. Tried by creating (and removing)
    a directory in it, or where it will be created: permission bits do not tell (root, read-only
    mounts, /proc)."""
    where = path
    while not os.path.lexists(where) and where != where.parent:
        where = where.parent
    if not where.is_dir():
        under = "" if where == path else f" lies under {where}, which"
        raise UserError(f"output.dir: {path}{under} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".batchspec-probe-", dir=where))
    except OSError as exc:
        how = "cannot write in it" if where == path else f"cannot be created in {where}"
        raise UserError(f"output.dir: {path}: {how} ({exc.strerror})") from None


def domain_warnings(spec: JobSpec, units: list[WorkUnit], limit: int | None) -> list[str]:
    """``per_domain`` entries (K, tree shapes) that name no domain of the input: a typo, or a
    domain this input lacks; either way they change nothing."""
    known = sorted({u.domain for u in units if u.domain is not None})
    s = spec.speculative
    tables = {"speculative.per_domain": s.per_domain}
    if s.tree is not None:
        tables["speculative.tree.per_domain"] = s.tree.per_domain
    where = f"the first {limit} rows" if limit is not None else "the input"
    if spec.input.domain_column is None:
        known_text = "input.domain_column is not set (no domains)"
    elif known:
        known_text = f"the domains of {where} are {', '.join(known)}"
    else:
        known_text = f"no row of {where} has a domain"
    warnings = []
    for key, table in tables.items():
        unknown = [d for d in table if d not in known]
        if unknown:
            warnings.append(f"{key}: {', '.join(unknown)} named, but {known_text}; ignored")
    return warnings


def check_draft_layers(layers: list[int], model_dir: Path) -> None:
    """The self-draft's layers must exist in the model they are cut from."""
    config = json.loads((model_dir / "config.json").read_text())
    count = int(config.get("num_hidden_layers", 0))
    if max(layers) >= count:
        raise UserError(
            f"speculative.tree.draft_layers: layer {max(layers)} does not exist; "
            f"{model_dir.name} has layers 0..{count - 1}"
        )
