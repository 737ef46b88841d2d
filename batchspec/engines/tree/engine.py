"""batchspec's draft-tree engine (``base.Engine``): torch and transformers only, CPU or CUDA.

One loop, readable in one sitting, after gpt-fast's ``generate.py``::

    fill free slots from the next units (prefill; the first token is sampled plainly)
    every step, for the B rows in flight:
        draft a tree under each row's root      (a drafter: n-gram trie or draft model)
        verify all trees in ONE forward         (tree attention mask, positions by depth)
        accept per row                          (emit.py; greedy: longest argmax path;
                                                 sampled: multi-candidate rejection sampling)
        keep the accepted path in the KV cache  (KVCache.commit), emit path + bonus token
        finished rows free their slots; a unit whose rows are all done is yielded

K is the number of draft nodes per step (0: plain decoding, the same code with a tree of one
node), so the worker, ``tune`` and the K controller treat this engine as they treat vLLM. Unlike
vLLM's, it is a choice per row, not per engine: each row decodes at its unit's K
(``UnitRequests.k``, else the K the engine was built with), rows of different K in one batch
(a K=0 row is a root alone in the same forward, and never touches the drafter), so a K change
costs no engine and no drained batch.

Everything stays on the model's device (CPU or CUDA): logits, the sampling distributions and
the random generators; only tokens and probabilities come back to Python, as scalars.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator

import torch

from batchspec.engines import planted
from batchspec.engines.base import EngineFailure, UnitSource
from batchspec.engines.tree.accept import Draws, TorchDraws
from batchspec.engines.tree.admit import OpenUnit, Prompts, closed, open_unit
from batchspec.engines.tree.drafting import Ask, Learner, ask_for, learn_row
from batchspec.engines.tree.emit import Emitter
from batchspec.engines.tree.load import Target, load_target, max_k, open_drafter
from batchspec.engines.tree.multi import DraftCosts, DrafterSet, recorded_method
from batchspec.engines.tree.profile import StepProfile, load_or_measure
from batchspec.engines.tree.rows import Stops, TreeRow
from batchspec.engines.tree.shape import DraftTree, batch_layout
from batchspec.spec import JobSpec
from batchspec.spec.tree import TREE, EngineName
from batchspec.units import UnitRequests, UnitResult


class TreeEngine:
    """Draft trees from a drafter (``drafting.Drafter``: n-gram or draft model) verified on
    batchspec's own model runner (``model.TreeModel``)."""

    name: EngineName = TREE
    k_per_unit = True

    def __init__(
        self, spec: JobSpec, k: int, logprobs: int | None = None, target: Target | None = None
    ):
        """Load the job's model (``target``: one already loaded, for tests)."""
        started = time.perf_counter()
        self.spec, self.k = spec, k
        self.method = self._method(k)
        target = target or load_target(spec, max_k(spec, k))
        self.model, self.tokenizer = target.model, target.tokenizer
        self.max_model_len = target.max_model_len
        self.k_cap = self.model.max_len - self.max_model_len - 1
        """The largest K a unit may ask for: the cache's room for a tree behind the longest row."""
        self.stops = Stops(target.eos_ids, list(spec.sampling.stop), self.tokenizer)
        self.drafter = open_drafter(spec, min(max_k(spec, k), self.k_cap), self.model)
        self.draft_costs: DraftCosts = getattr(self.drafter, "costs", None) or DraftCosts()
        """Each drafter's drafting seconds per row and step, measured (``multi.py``)."""
        self.model_name = target.name
        self._profile: StepProfile | None = None
        self.logprobs = spec.sampling.logprobs_for(logprobs)
        self.free = list(range(spec.model.max_num_seqs))
        """Free slots, a heap: rows take the lowest, so rows in flight stay adjacent (cheap)."""
        self.rows: list[TreeRow] = []
        self.prompts = Prompts(self.model, lambda r: r.drafter if self._drafts(r) else None)
        self.rng = self._generator(spec.model.seed)
        """Rows without a seed of their own draw from this one, in the order they step."""
        self.emitter = Emitter(spec.sampling, self.stops, self.logprobs, planted.planted_on())
        """What a row emits from its logits: the sampling rules (``emit.py``)."""
        self.draws: Callable[[torch.Generator], Draws] = TorchDraws
        """A row's random draws (``accept.Draws``) from its generator, made once per row: every
        token it samples comes from them (tests walk them)."""
        self.shared_prefills = 0
        """Prompts copied from a row in flight instead of computed (a prompt's n samples)."""
        self.build_s = time.perf_counter() - started

    def _method(self, k: int, drafter: str | None = None) -> str:
        """The method recorded for rows decoded at K = ``k`` with ``drafter``."""
        return recorded_method(self.spec.speculative, k, drafter)

    def unit_k(self, unit: UnitRequests) -> int:
        """The K ``unit``'s rows decode at: its own, else the engine's."""
        return self.k if unit.k is None else unit.k

    @property
    def step_profile(self) -> StepProfile:
        """Seconds per step by batch size and draft nodes (``profile``) for every K the job
        may ask: loaded from the cache or measured on first use (the engine must be idle
        then), checked against this engine's own steps from then on (``step_check``)."""
        if self._profile is None:
            s = self.spec.speculative
            grid = {self.k, *s.k_grid, *s.per_domain.values()} if self.drafter else {0}
            nodes = [k for k in grid if k <= self.k_cap]
            self._profile = load_or_measure(self.model, self.model_name, nodes)
        return self._profile

    @property
    def learns_outputs(self) -> bool:
        """Whether its drafts come from the job's outputs (``base.LearnsOutputs``)."""
        return isinstance(self.drafter, Learner)

    @property
    def learner(self) -> Learner | None:
        """Its drafter that learns from the job's outputs (the suffix drafter), or None: the
        replay reads that drafter's indexes below each row's ``suffix_view``."""
        drafter = self.drafter
        return getattr(drafter, "learner", drafter) if isinstance(drafter, Learner) else None

    def learn_outputs(self, domain: str | None, outputs: list[list[int]]) -> None:
        """Outputs of ``domain`` finished elsewhere (committed parts), oldest first, as if
        its rows had finished here before any row now in flight asked for a draft."""
        if isinstance(self.drafter, Learner):
            for out in outputs:
                self.drafter.learn(domain, out)

    def _generator(self, seed: int) -> torch.Generator:
        """A generator on the model's device: sampling there needs one (a CPU generator
        cannot draw for CUDA tensors); on the CPU it is the generator it always was."""
        return torch.Generator(device=self.model.device).manual_seed(seed)

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """``base.Engine.run``: rows join as slots free up, once the finished units are out."""
        opened: list[OpenUnit] = []
        waiting: deque[tuple[OpenUnit, int]] = deque()
        try:
            while not should_abort():
                yield from self._finished(opened)
                while self.free and (waiting or self._pull(source, opened, waiting)):
                    if waiting:
                        self._start(*waiting.popleft())
                if not self.rows:
                    if waiting or any(e.left == 0 for e in opened):  # ended at prefill
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

    def _pull(self, source: UnitSource, opened: list[OpenUnit], waiting: deque) -> bool:
        unit = source.next_unit()
        if unit is None:
            return False
        entry, rows = open_unit(unit, self.unit_k(unit), self.k_cap, self.drafter is not None)
        opened.append(entry)
        waiting.extend((entry, i) for i in rows)
        return True

    def _start(self, owner: OpenUnit, index: int) -> None:
        """Prefill a row into a free slot and sample its first token plainly."""
        req = owner.unit.rows[index]
        prompt = list(req.prompt_token_ids or [])
        gen = self._generator(req.seed) if req.seed is not None else self.rng
        row = TreeRow(
            req, owner, index, heapq.heappop(self.free),
            max_tokens=min(
                (req.sampling or self.spec.sampling).max_tokens, self.max_model_len - len(prompt)
            ),
            draws=self.draws(gen), queued=time.monotonic(),
            logprobs=[] if self.logprobs is not None else None, k=self.unit_k(owner.unit),
            drafter=owner.unit.drafter or self.spec.speculative.method,
        )  # fmt: skip
        row.scheduled = time.monotonic()
        try:
            logits = self._prefill(row, prompt)
        except Exception as exc:
            raise EngineFailure(f"tree engine prefill failed: {exc!r}") from exc
        first = self.emitter.first(row, prompt, logits)
        if self._drafts(row):
            self.drafter.extend(row.slot, [first])
        self.rows.append(row)
        if row.finish is not None:
            self._finish(row)

    def _prefill(self, row: TreeRow, prompt: list[int]) -> torch.Tensor:
        """The prompt's KV into the row's slot and its last logits (``admit.Prompts``: a
        prompt a row in flight has is copied); the drafter started on it."""
        twin = self.prompts.prefill(row, prompt, self.rows)
        self.shared_prefills += twin is not None
        if self._drafts(row):
            if isinstance(self.drafter, DrafterSet):
                self.drafter.assign(row.slot, row.drafter)
            self.drafter.start(row.slot, prompt, twin.slot if twin is not None else None)
        return row.prefill_logits

    def _drafts(self, row: TreeRow) -> bool:
        """Whether the drafter keeps this row (rows at K=0 never ask it for a tree)."""
        return self.drafter is not None and row.k > 0

    def _ask(self, row: TreeRow) -> Ask | None:
        """What the row asks of the drafter this step; None: no draft."""
        tree_spec = self.spec.speculative.tree
        shape = tree_spec.shape_for(row.req.domain) if tree_spec is not None else None
        return ask_for(row.slot, row.k, shape, row.max_tokens - len(row.out), row.req.domain)

    def _trees(self) -> list[DraftTree]:
        """Each row's draft (up to K best-ranked nodes), or its root alone."""
        trees: dict[int, DraftTree] = {}
        asks = [a for a in map(self._ask, self.rows) if a is not None]
        if self.drafter is not None and asks:
            try:
                drafted = self.drafter.draft(asks)
            except Exception as exc:
                raise EngineFailure(f"tree engine draft failed: {exc!r}") from exc
            trees = {a.slot: t for a, t in zip(asks, drafted, strict=True)}
        out = [trees[r.slot] if r.slot in trees else DraftTree([r.root], [-1]) for r in self.rows]
        for r, t in zip(self.rows, out, strict=True):  # a wrong root: tokens plain never gives
            if t.tokens[0] != r.root:
                raise EngineFailure(
                    f"slot {r.slot}: the drafter's tree is rooted at token {t.tokens[0]}, "
                    f"the row's root is {r.root}"
                )
        return out

    def _step(self) -> None:
        """One verify forward for every row in flight, then acceptance row by row; its
        seconds check the step profile once someone asked for it."""
        started = time.perf_counter()
        trees = self._trees()
        drafting = time.perf_counter() - started
        if not isinstance(self.drafter, DrafterSet):  # a DrafterSet times each drafter itself
            drafting_rows = sum(r.k > 0 for r in self.rows)
            self.draft_costs.add(self.spec.speculative.method, drafting, drafting_rows)
        lens = self.model.cache_len
        batch = batch_layout(trees, [lens[r.slot] for r in self.rows])
        try:
            slots, sizes = [r.slot for r in self.rows], batch.sizes
            logits = self.model.verify(
                slots, batch.tokens, batch.positions, batch.tree_mask, sizes=sizes
            )
        except Exception as exc:
            raise EngineFailure(f"tree engine step failed: {exc!r}") from exc
        for b, (row, tree) in enumerate(zip(list(self.rows), trees, strict=True)):
            self._accept(row, tree, logits[b, : tree.size])
        if self._profile is not None:
            # The profile prices the verify forward; drafting is priced per drafter (multi.py).
            spent = time.perf_counter() - started - drafting
            self._profile.observe_step([t.size - 1 for t in trees], spent)

    def _accept(self, row: TreeRow, tree: DraftTree, logits: torch.Tensor) -> None:
        """Accept a path of the row's verified tree (``emit.Emitter``), keep it in the cache;
        counts take only what was emitted (a row may end inside its path)."""
        got = self.emitter.step(row, tree, logits)
        self.model.commit(row.slot, got.kept)
        cap = min(row.k, self._depth_cap(row))
        row.count_step(tree.size - 1, max(tree.depths()), len(got.kept) - 1, got.counted, cap)
        if row.finish is not None:
            self._finish(row)
        elif self._drafts(row):
            self.drafter.extend(row.slot, got.emitted)

    def _depth_cap(self, row: TreeRow) -> int:
        tree_spec = self.spec.speculative.tree
        return tree_spec.shape_for(row.req.domain).depth() if tree_spec is not None else row.k

    def _finish(self, row: TreeRow) -> None:
        self.rows.remove(row)
        self.prompts.forget(row)
        row.view = learn_row(self.drafter, row.slot, row.req.domain, row.out)
        self._release(row.slot)
        if self.stops.stop:
            row.text = self.stops.text(row.out)
        row.owner.finish(row.index, row.result(self.tokenizer, row.k > 0), len(row.out))

    def _finished(self, opened: list[OpenUnit]) -> Iterator[UnitResult]:
        for entry in closed(opened):
            k = self.unit_k(entry.unit)
            method = self._method(k, entry.unit.drafter)
            yield UnitResult(entry.unit, list(entry.results), k, method, self.name)

    def close(self) -> None:
        """Free the model and its cache before another engine starts (once; again: nothing)."""
        if hasattr(self, "model"):
            del self.model
        gc.collect()
