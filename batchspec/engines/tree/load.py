"""What the tree engine decodes with, loaded for a job: the target model on its device, the
tokenizer, the end-of-sequence tokens, the drafter; and the process's CPU threads.

The engine takes a ``Target`` ready-made too, so tests run its loop on a small model of
their own without a model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from batchspec.engines.cpu_threads import bind_cpus
from batchspec.engines.tree import ops
from batchspec.engines.tree.drafter import growth_scratch, open_model_drafter
from batchspec.engines.tree.drafting import Drafter
from batchspec.engines.tree.eagle import open_eagle_drafter
from batchspec.engines.tree.hybrid import NgramFirst
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.multi import drafter_set
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.suffix import SuffixDrafter
from batchspec.engines.vllm_fork import parallel_compute_ran
from batchspec.models import load_tokenizer, resolve_model
from batchspec.spec import JobSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Target:
    """The model rows are decoded with, and how to read and end its output."""

    model: TreeModel
    """Its cache holds ``max_num_seqs`` slots of at least ``max_model_len + K + 1``
    positions: a step writes every row's tree, padded to K + 1 nodes, behind its prefix."""
    tokenizer: Any
    eos_ids: set[int]
    max_model_len: int
    name: str = ""
    """Where the model came from (its directory): part of its step profile's cache key."""


def load_target(spec: JobSpec, k: int) -> Target:
    """The job's model on the GPU when there is one (else the CPU, on this worker's cores),
    in the job's dtype (default: float32 on the CPU, bfloat16 on the GPU)."""
    m = spec.model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parallel_compute_ran()  # a vLLM engine started here later spawns (vllm_fork)
    if device == "cpu":
        bind_cpus()
    model_dir = resolve_model(m.model, "model.model", spec.resolve("."), auto_prepare=True)
    config = json.loads((model_dir / "config.json").read_text())
    dtype = DTYPES.get(m.dtype, torch.float32 if device == "cpu" else torch.bfloat16)
    max_model_len = m.max_model_len or int(config.get("max_position_embeddings", 2048))
    model = TreeModel.load(model_dir, dtype, device, m.max_num_seqs, max_model_len + k + 1)
    if m.enforce_eager:  # as on vLLM: no graph capture (graphs.py), nothing compiled (ops.py)
        model.graphs, model.ops = None, ops.EAGER
    if m.max_num_seqs == 1:  # every step one row: compiled (TreeModel.one_row)
        model.use_one_row_kernel()
    tok_dir = (
        resolve_model(m.tokenizer, "model.tokenizer", spec.resolve("."))
        if m.tokenizer
        else model_dir
    )
    tokenizer = load_tokenizer(Path(tok_dir), "model.tokenizer")
    return Target(model, tokenizer, eos_ids(model_dir, tokenizer), max_model_len, str(model_dir))


def max_k(spec: JobSpec, k: int) -> int:
    """The largest K a unit of this job may ask for (the engine's own, the grid's, the
    domains' fixed ones): the cache and the draft's scratch are sized for it at load, so that
    no K change rebuilds anything. ``k`` without a speculative method."""
    s = spec.speculative
    if s.method == "none":
        return k
    return max(k, s.num_speculative_tokens, *s.k_grid, *s.per_domain.values())


def open_drafter(spec: JobSpec, k: int, target: TreeModel) -> Drafter | None:
    """The job's drafter (``drafting.Drafter``) on the target's device; None at K=0. With
    ``speculative.drafters``, all of them in one ``multi.DrafterSet`` (sharing one n-gram
    drafter's per-slot tries, and one model between its plain and n-gram-first entries),
    each unit's rows drafting with the unit's."""
    if k <= 0:
        return None
    s = spec.speculative
    ngram = NgramDrafter(s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
    models: dict[str, Drafter] = {}
    if s.drafters is None:
        hybrid = s.tree is not None and s.tree.ngram_first
        return _drafter(spec, s.method + ("+ngram" if hybrid else ""), k, target, ngram, models)
    return drafter_set({d: _drafter(spec, d, k, target, ngram, models) for d in s.drafters})


def _drafter(
    spec: JobSpec,
    name: str,
    k: int,
    target: TreeModel,
    ngram: NgramDrafter,
    models: dict[str, Drafter],
) -> Drafter:
    """The drafter ``name`` (a method; ``+ngram``: n-gram trees first, ``hybrid.NgramFirst``)
    over the shared ``ngram`` drafter and the model drafters of ``models`` (loaded once)."""
    s = spec.speculative
    tree = s.tree
    depth = max([tree.depth(), *(t.depth() for t in tree.per_domain.values())]) if tree else 1
    scratch = growth_scratch(k, depth)  # behind the longest row the target may hold
    method, _, first = name.partition("+")
    if method == "suffix":
        return SuffixDrafter(ngram, s.suffix)
    if method not in ("draft_model", "eagle3"):
        return ngram
    if method not in models:
        opener = open_model_drafter if method == "draft_model" else open_eagle_drafter
        models[method] = opener(spec, target, target.max_len + scratch)
    return NgramFirst(ngram, models[method]) if first == "ngram" else models[method]


def eos_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """End-of-sequence tokens as vLLM takes them: the tokenizer's and generation_config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()
    return ids
