"""batchspec's draft-tree engine (``base.Engine``): torch and transformers only, CPU or CUDA.

One loop, readable in one sitting, after gpt-fast's ``generate.py``::

    fill free slots from the next units (prefill; the first token is sampled plainly)
    every step, for the B rows in flight:
        draft a tree under each row's root      (n-gram trie over prompt + output)
        verify all trees in ONE forward         (tree attention mask, positions by depth)
        accept per row                          (greedy: longest argmax path; sampled:
                                                 multi-candidate rejection sampling)
        keep the accepted path in the KV cache  (compaction), emit path + bonus token
        finished rows free their slots; a unit whose rows are all done is yielded

K is the number of draft nodes per step (0: plain decoding, the same code with a tree of one
node), so the worker, ``tune`` and the K controller treat this engine as they treat vLLM.
"""

from __future__ import annotations

import gc
import heapq
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from batchspec.engines import planted
from batchspec.engines.base import EngineFailure, UnitSource
from batchspec.engines.tree.accept import accept_greedy, accept_sampled
from batchspec.engines.tree.drafter import Growth, open_drafter, shape_ranks
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.ngram import NgramIndex
from batchspec.engines.tree.rows import Stops, TreeRow, target_probs, top_logprobs
from batchspec.engines.tree.shape import DraftTree, batch_layout
from batchspec.models import load_tokenizer, resolve_model
from batchspec.spec import JobSpec
from batchspec.spec_tree import TreeShape
from batchspec.units import RowResult, UnitRequests, UnitResult

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""The core slice ``batchspec run --workers N`` gives each worker on CPU (vLLM's variable:
``0,1`` or ``0-3``; ``|`` separates tensor-parallel ranks, the tree engine takes the first)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Open:
    """A unit in flight: its results so far and how many rows are still decoding."""

    def __init__(self, unit: UnitRequests):
        self.unit = unit
        self.results: list[RowResult | None] = [None] * len(unit.rows)
        self.left = 0


class TreeEngine:
    """Draft trees with n-gram drafts on batchspec's own model runner (``model.TreeModel``)."""

    def __init__(self, spec: JobSpec, k: int, logprobs: int | None = None):
        started = time.perf_counter()
        _bind_cpus()
        self.spec, self.k = spec, k
        self.method = "none" if k == 0 else f"{spec.speculative.method}-tree"
        m, s = spec.model, spec.speculative
        model_dir = resolve_model(m.model, "model.model", spec.resolve("."), auto_prepare=True)
        config = json.loads((model_dir / "config.json").read_text())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = DTYPES.get(m.dtype, torch.float32 if device == "cpu" else torch.bfloat16)
        self.max_model_len = m.max_model_len or int(config.get("max_position_embeddings", 2048))
        # Room beyond a full-length row: a step writes every row's tree, padded to the
        # batch's largest (K + 1 nodes), behind the row's committed prefix.
        room = self.max_model_len + k + 1
        self.model = TreeModel.load(model_dir, dtype, device, m.max_num_seqs, room)
        if m.max_num_seqs == 1:  # every step one row: compiled (TreeModel.one_row)
            self.model.use_one_row_kernel()
        tok_dir = (
            resolve_model(m.tokenizer, "model.tokenizer", spec.resolve("."))
            if m.tokenizer
            else model_dir
        )
        self.tokenizer = load_tokenizer(Path(tok_dir), "model.tokenizer")
        self.stops = Stops(
            _eos_ids(model_dir, self.tokenizer), list(spec.sampling.stop), self.tokenizer
        )
        self.lookup = (s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
        self.drafter = (
            # The draft's scratch: the root, up to K fed nodes, and one forward's padding.
            open_drafter(spec, self.model, dtype, device, room + k + 1)
            if k > 0 and s.method == "draft_model"
            else None
        )
        self.logprobs = logprobs
        self.free = list(range(m.max_num_seqs))
        """Free slots, a heap: rows take the lowest, so rows in flight stay adjacent (cheap)."""
        self.rows: list[TreeRow] = []
        self.by_prompt: dict[int, TreeRow] = {}
        """A row in flight per prompt (by hash), whose cached prompt a new row may copy."""
        self.rng = torch.Generator().manual_seed(m.seed)
        self.planted = planted.planted_on()
        self.build_s = time.perf_counter() - started

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """``base.Engine.run``: rows join the batch as slots free up, across unit boundaries."""
        opened: list[_Open] = []
        waiting: deque[tuple[_Open, int]] = deque()
        try:
            while not should_abort():
                while self.free and (waiting or self._pull(source, opened, waiting)):
                    if waiting:
                        self._start(*waiting.popleft())
                yield from self._finished(opened)
                if not self.rows:
                    if waiting:
                        continue
                    if source.exhausted():
                        return
                    source.wait()
                    continue
                self._step()
        finally:
            for row in self.rows:
                self._release(row.slot)
            self.rows.clear()

    def _release(self, slot: int) -> None:
        self.model.release(slot)
        if self.drafter is not None:
            self.drafter.release(slot)
        heapq.heappush(self.free, slot)

    def _pull(self, source: UnitSource, opened: list[_Open], waiting: deque) -> bool:
        unit = source.next_unit()
        if unit is None:
            return False
        entry = _Open(unit)
        opened.append(entry)
        for i, req in enumerate(unit.rows):
            if req.error is not None:
                entry.results[i] = RowResult(req, error=req.error)
            else:
                entry.left += 1
                waiting.append((entry, i))
        return True

    def _start(self, owner: _Open, index: int) -> None:
        """Prefill a row into a free slot and sample its first token plainly."""
        req = owner.unit.rows[index]
        prompt = list(req.prompt_token_ids or [])
        gen = torch.Generator().manual_seed(req.seed) if req.seed is not None else self.rng
        row = TreeRow(
            req, owner, index, heapq.heappop(self.free), NgramIndex(*self.lookup),
            max_tokens=min(self.spec.sampling.max_tokens, self.max_model_len - len(prompt)),
            generator=gen, queued=time.monotonic(),
            logprobs=[] if self.logprobs else None,
        )  # fmt: skip
        row.scheduled = time.monotonic()
        try:
            logits = self._prefill(row, prompt)
        except Exception as exc:
            raise EngineFailure(f"tree engine prefill failed: {exc!r}") from exc
        row.ngram.extend(prompt)
        first = self._choose(logits.unsqueeze(0), gen)
        lps = top_logprobs(logits.unsqueeze(0), [first]) if self.logprobs else None
        row.emit([first], self.stops, lps)
        row.ngram.extend([first])
        self.rows.append(row)
        if row.finish is not None:
            self._finish(row)

    def _prefill(self, row: TreeRow, prompt: list[int]) -> torch.Tensor:
        """The prompt's KV into the row's slot and its last logits; a prompt that a row in
        flight already has (n samples of one prompt) is copied from that row's slot."""
        key = hash(tuple(prompt))
        twin = self.by_prompt.get(key)
        if twin is not None and twin.req.prompt_token_ids == prompt and twin in self.rows:
            self.model.share_prefix(twin.slot, row.slot, len(prompt))
            row.prefill_logits = twin.prefill_logits
        else:
            twin = None
            row.prefill_logits = self.model.prefill(row.slot, prompt)
            self.by_prompt[key] = row
        if self.drafter is not None:
            self.drafter.start(row.slot, prompt, twin.slot if twin is not None else None)
        return row.prefill_logits

    def _choose(self, logits: torch.Tensor, gen: torch.Generator) -> int:
        s = self.spec.sampling
        if s.temperature == 0:
            return int(torch.argmax(logits[0]))
        probs = target_probs(logits, s)
        return int(torch.multinomial(probs[0], 1, generator=gen))

    def _plan(self, row: TreeRow) -> tuple[TreeShape, int] | None:
        """The row's shape and how deep its draft may go this step; None: no draft."""
        tree_spec = self.spec.speculative.tree
        # No path needs to outrun max_tokens (the cache has room for K + 1 nodes).
        depth = row.max_tokens - len(row.out)
        shape = tree_spec.shape_for(row.req.domain) if tree_spec is not None else None
        if self.k <= 0 or depth <= 0 or shape is None:
            return None
        return shape, min(shape.depth(), depth)

    def _trees(self) -> list[DraftTree]:
        """Each row's draft: up to K best-ranked nodes (n-gram trie or draft model)."""
        plans = [self._plan(row) for row in self.rows]
        if self.drafter is not None:
            return self._model_trees(plans)
        trees = []
        for row, plan in zip(self.rows, plans, strict=True):
            if plan is None:
                trees.append(DraftTree([row.root], [-1]))
                continue
            shape, depth = plan
            trees.append(row.ngram.draft(self.k, depth, shape.branching, _paths(shape)))
        return trees

    def _model_trees(self, plans: list[tuple[TreeShape, int] | None]) -> list[DraftTree]:
        """Trees from the draft model, grown for all rows together (one forward per depth);
        each row hands over the tokens the draft has not seen yet, ending with its root."""
        assert self.drafter is not None
        lens = self.drafter.model.cache_len
        work, growths = [], []
        for row, plan in zip(self.rows, plans, strict=True):
            if plan is None:
                growths.append(None)
                continue
            shape, depth = plan
            fresh = row.out[lens[row.slot] - len(row.req.prompt_token_ids or []) :]
            ranks = shape_ranks(self.k, depth, shape.branching, _paths(shape))
            growths.append(Growth(fresh[-1], self.k, ranks))
            work.append((row.slot, fresh, growths[-1]))
        try:
            self.drafter.draft(work)
        except Exception as exc:
            raise EngineFailure(f"tree engine draft failed: {exc!r}") from exc
        return [
            g.tree() if g is not None else DraftTree([row.root], [-1])
            for row, g in zip(self.rows, growths, strict=True)
        ]

    def _step(self) -> None:
        """One verify forward for every row in flight, then acceptance row by row."""
        trees = self._trees()
        lens = self.model.cache_len
        batch = batch_layout(trees, [lens[r.slot] for r in self.rows])
        try:
            logits = self.model.verify(
                [r.slot for r in self.rows], batch.tokens, batch.positions, batch.tree_mask
            ).cpu()
        except Exception as exc:
            raise EngineFailure(f"tree engine step failed: {exc!r}") from exc
        for b, (row, tree) in enumerate(zip(list(self.rows), trees, strict=True)):
            self._accept(row, tree, logits[b, : tree.size])

    def _accept(self, row: TreeRow, tree: DraftTree, logits: torch.Tensor) -> None:
        s = self.spec.sampling
        if self.planted:
            path = _first_path(tree)
            last = path[-1] if path else 0
            bonus = self._choose(logits[last : last + 1], row.generator)
        elif s.temperature == 0:
            path, bonus = accept_greedy(tree, logits)
        else:
            path, bonus = accept_sampled(tree, target_probs(logits, s), row.generator)
        kept = [0, *path]
        self.model.commit(row.slot, kept)
        emitted = [tree.tokens[i] for i in path] + [bonus]
        lps = top_logprobs(logits[kept], emitted) if self.logprobs else None
        depth = max(tree.depths())
        cap = min(self.k, self._depth_cap(row))
        row.count_step(tree.size - 1, depth, len(path), cap)
        row.emit(emitted, self.stops, lps)
        row.ngram.extend(emitted)
        if row.finish is not None:
            self._finish(row)

    def _depth_cap(self, row: TreeRow) -> int:
        tree_spec = self.spec.speculative.tree
        return tree_spec.shape_for(row.req.domain).depth() if tree_spec is not None else self.k

    def _finish(self, row: TreeRow) -> None:
        self.rows.remove(row)
        key = hash(tuple(row.req.prompt_token_ids or []))
        if self.by_prompt.get(key) is row:
            del self.by_prompt[key]
        self._release(row.slot)
        if self.stops.stop:
            row.text = self.stops.text(row.out)
        owner = row.owner
        owner.results[row.index] = row.result(self.tokenizer, self.k > 0)
        owner.left -= 1
        owner.unit.finished += 1
        owner.unit.finished_tokens += len(row.out)

    def _finished(self, opened: list[_Open]) -> Iterator[UnitResult]:
        for entry in [e for e in opened if e.left == 0]:
            opened.remove(entry)
            yield UnitResult(entry.unit, list(entry.results), self.k, self.method)

    def close(self) -> None:
        """Free the model and its cache before another engine starts."""
        del self.model
        gc.collect()


def _bind_cpus() -> None:
    """Run on this worker's cores only, so that workers sharing a machine do not contend
    (the model's thread count follows the affinity)."""
    bind = os.environ.get(CPU_BIND_ENV, "auto")
    if torch.cuda.is_available():
        return
    if bind in ("auto", "nobind", ""):
        # One thread per core this process may use: more threads than cores (torch's
        # default counts the machine's cores) made steps ~10x slower on a shared machine.
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        return
    cpus: set[int] = set()
    for part in bind.split("|")[0].split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))


def _paths(shape: TreeShape) -> list[tuple[int, ...]] | None:
    return [tuple(p) for p in shape.paths] if shape.paths is not None else None


def _first_path(tree: DraftTree) -> list[int]:
    """The planted bias's path: first-ranked children from the root down to a leaf."""
    path: list[int] = []
    node = 0
    while tree.children(node):
        node = tree.children(node)[0]
        path.append(node)
    return path


def _eos_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """End-of-sequence tokens as vLLM takes them: the tokenizer's and generation_config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()
    return ids
