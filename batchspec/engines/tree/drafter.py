"""Draft trees from a draft model (``drafting.Drafter``), as EAGLE-2 grows them: top-ranked
children per node, one batched draft forward per depth, and only the K nodes of highest
cumulative draft probability kept (``shape.select_budget``).

The draft keeps its own static cache (``model.TreeModel``) of each row's committed tokens. A
step's first forward feeds what the target committed since the last step (the accepted path
and the bonus token, i.e. the new root, last) as a chain; its logits at the root give the
depth-1 candidates. Every later forward feeds only the frontier (the kept nodes of the last
depth): their KV lands in scratch behind what earlier forwards of the step wrote, and each
node attends to the prefix, its ancestors' scratch KV and itself, at the position of its
depth. So a depth costs one forward of at most K nodes per row however deep the tree is.

Children are chosen deterministically (top ranks), so the target verifies them with the
one-hot rule, which is lossless for any choice that does not depend on the verifier's draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.shape import DraftTree, batch_layout, select_budget, top_budget
from batchspec.models import resolve_model
from batchspec.spec import JobSpec

Ranks = Callable[[tuple[int, ...]], Sequence[int]]
"""The child ranks a node may have, from its rank path (root: ``()``): the tree's shape."""


def shape_ranks(
    budget: int,
    max_depth: int,
    branching: Sequence[int] | None = None,
    paths: Sequence[tuple[int, ...]] | None = None,
) -> Ranks:
    """Allowed child ranks under a static shape (``branching`` per depth or explicit rank
    ``paths``), else a dynamic tree's: the top ``budget`` children of any node. Nothing below
    ``max_depth``; never more ranks than the budget (a node's children beyond rank K-1 could
    not be among the K nodes kept)."""
    listed = set(paths) if paths is not None else None

    def ranks(path: tuple[int, ...]) -> Sequence[int]:
        depth = len(path)
        if depth >= max_depth:
            return []
        if listed is not None:
            return [r for r in range(budget) if (*path, r) in listed]
        if branching is not None:
            return range(min(branching[depth], budget)) if depth < len(branching) else []
        return range(budget)

    return ranks


def growth_scratch(budget: int, depth: int) -> int:
    """Draft-cache positions one tree's growth may take behind a row's prefix: the root, then
    per depth a frontier of at most ``budget`` kept nodes (one batched forward pads every row
    to the longest). Nodes kept at one depth and displaced at the next were fed all the same,
    so ``budget + 1`` is not enough: at budget 8 and depth 8 growth fed up to 26 nodes on
    random distributions, and a row near its cache's end failed with "cache full"."""
    return 1 + budget * max(depth, 1)


class Growth:
    """One row's tree as it grows: every candidate so far (node 0 the root) with its cumulative
    draft log-probability; ``frontier`` holds the kept nodes whose children come next."""

    def __init__(self, root: int, budget: int, ranks: Ranks) -> None:
        self.budget, self.ranks = budget, ranks
        self.tokens, self.parents, self.scores = [root], [-1], [0.0]
        self.paths: list[tuple[int, ...]] = [()]
        self.kept = [0]
        """The root and the candidates among the best ``budget``, ascending (topological)."""
        self.frontier = [0] if budget > 0 and ranks(()) else []
        self.fed = {0: 0}
        """Node -> the scratch position (behind the committed prefix) holding its draft KV."""
        self.used = 1
        """Scratch positions taken: the root's, then every fed frontier's."""

    def feed(self) -> list[tuple[int, int, list[int]]]:
        """The frontier as the next forward feeds it, and records where it lands: per node,
        (token, depth, the scratch positions of its ancestors, all fed before)."""
        out = []
        for i, node in enumerate(self.frontier):
            cols, up = [], self.parents[node]
            while up >= 0:
                cols.append(self.fed[up])
                up = self.parents[up]
            out.append((self.tokens[node], len(self.paths[node]), cols))
            self.fed[node] = self.used + i
        return out

    def expand(self, logprobs: torch.Tensor) -> None:
        """Add the allowed top-ranked children of every frontier node (``logprobs`` [frontier,
        vocab], the draft's log-distribution at each), then keep the best ``budget``; the
        kept new children are the next frontier."""
        new: list[int] = []
        for node, lp in zip(self.frontier, logprobs, strict=True):
            ranks = list(self.ranks(self.paths[node]))
            if not ranks:
                continue
            top = torch.topk(lp, max(ranks) + 1)
            ids, values = top.indices.tolist(), top.values.tolist()  # one copy from the device
            for r in ranks:
                self.tokens.append(ids[r])
                self.parents.append(node)
                self.scores.append(self.scores[node] + values[r])
                self.paths.append((*self.paths[node], r))
                new.append(len(self.tokens) - 1)
        self.kept = sorted(select_budget(self.parents, self.scores, self.budget))
        keep = set(self.kept)
        # A node that may have no children (the shape's last depth) costs no forward.
        self.frontier = [n for n in new if n in keep and self.ranks(self.paths[n])]

    def tree(self) -> DraftTree:
        """The draft: the best ``budget`` candidates, siblings best first."""
        return top_budget(self.tokens, self.parents, self.scores, self.budget)


class ModelDrafter:
    """Draft trees for the rows in flight from a draft model with a cache of its own."""

    def __init__(self, model: TreeModel, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        """The target's: a draft's padded output head may be larger; its extra ids are cut."""
        self.fresh: dict[int, list[int]] = {}
        """Per slot, the tokens the row committed that the draft has not fed yet; the last
        one is the root of the row's next tree."""

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        """Put a new row's prompt into the draft cache (copied from ``twin``'s slot when a row
        in flight has the same prompt)."""
        if twin is not None:
            self.model.share_prefix(twin, slot, len(prompt))
        else:
            self.model.prefill(slot, list(prompt))
        self.fresh[slot] = []

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        self.fresh[slot].extend(tokens)

    def release(self, slot: int) -> None:
        self.model.release(slot)
        self.fresh.pop(slot, None)

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        """Each row's tree: its fresh tokens fed, then grown depth by depth."""
        growths = []
        for a in asks:
            ranks = shape_ranks(a.budget, a.depth, a.branching, a.paths)
            growths.append(Growth(self.fresh[a.slot][-1], a.budget, ranks))
        self._grow([(a.slot, self.fresh[a.slot], g) for a, g in zip(asks, growths, strict=True)])
        return [g.tree() for g in growths]

    def _grow(self, rows: list[tuple[int, list[int], Growth]]) -> None:
        """Grow each row's tree: ``rows`` holds (slot, the tokens committed by the target since
        the draft last saw the row, ending with the root, Growth); ``Growth.tree`` gives it.
        A row whose tree cannot grow (no budget) keeps its fresh tokens for the next step."""
        active = [r for r in rows if r[2].frontier]
        started = list(active)
        if active:
            self._first(active)
        while active := [r for r in active if r[2].frontier]:
            logits = self._extend(active)
            for b, (_, _, g) in enumerate(active):
                g.expand(torch.log_softmax(logits[b, : len(g.frontier)], dim=-1))
        for slot, _, _ in started:
            # The root's KV, at the slot's first scratch position, joins the prefix.
            self.model.commit(slot, [0])
            self.fresh[slot] = []

    def _first(self, rows: list[tuple[int, list[int], Growth]]) -> None:
        """Feed each row's fresh tokens as a chain; commit all but the root; expand the root."""
        chains = [DraftTree(fresh, list(range(-1, len(fresh) - 1))) for _, fresh, _ in rows]
        logits = self._forward([s for s, _, _ in rows], chains)
        for b, (slot, fresh, g) in enumerate(rows):
            if len(fresh) > 1:
                self.model.commit(slot, list(range(len(fresh) - 1)))
            g.expand(torch.log_softmax(logits[b, len(fresh) - 1 : len(fresh)], dim=-1))

    def _extend(self, rows: list[tuple[int, list[int], Growth]]) -> torch.Tensor:
        """One forward of every row's frontier only, behind the nodes fed before (their draft
        KV stays in scratch): each node sees the prefix, its ancestors and itself. Frontiers
        differ in size, so the forward is packed (``packing``: a pad costs no product)."""
        feeds = [g.feed() for _, _, g in rows]
        offsets = [g.used for _, _, g in rows]
        n = max(len(f) for f in feeds)
        lens = self.model.cache_len
        # Laid out on the host, moved to the model's device by verify in one copy each.
        tokens = torch.zeros(len(rows), n, dtype=torch.long, device="cpu")
        positions = torch.zeros(len(rows), n, dtype=torch.long, device="cpu")
        mask = torch.zeros(len(rows), n, max(offsets) + n, dtype=torch.bool, device="cpu")
        for b, ((slot, _, g), feed) in enumerate(zip(rows, feeds, strict=True)):
            positions[b] = lens[slot]
            for i, (token, depth, ancestors) in enumerate(feed):
                tokens[b, i] = token
                positions[b, i] += depth
                mask[b, i, ancestors] = True
            g.used += len(feed)
        slots, sizes = [s for s, _, _ in rows], [len(f) for f in feeds]
        logits = self.model.verify(slots, tokens, positions, mask, offsets, sizes)
        return logits[..., : self.vocab_size]

    def _forward(self, slots: list[int], trees: list[DraftTree]) -> torch.Tensor:
        lens = self.model.cache_len
        batch = batch_layout(trees, [lens[s] for s in slots])
        logits = self.model.verify(
            slots, batch.tokens, batch.positions, batch.tree_mask, sizes=batch.sizes
        )
        return logits[..., : self.vocab_size]


def open_model_drafter(spec: JobSpec, target: TreeModel, room: int) -> ModelDrafter:
    """The draft model on the target's device and dtype: ``speculative.model``, or the target
    itself, cut to ``tree.draft_layers`` when set (a self-draft shares the target's weights)."""
    s, batch = spec.speculative, spec.model.max_num_seqs
    dtype, device = target.dtype, target.device
    layers = s.tree.draft_layers if s.tree is not None else None
    if s.model is None:
        assert layers is not None, "the spec requires model or draft_layers"
        return ModelDrafter(target.layers_only(layers, batch, room), target.vocab_size)
    draft_dir = resolve_model(s.model, "speculative.model", spec.resolve("."), auto_prepare=True)
    if layers is None:
        draft = TreeModel.load(draft_dir, dtype, device, batch, room)
        return ModelDrafter(draft, target.vocab_size)
    whole = TreeModel.load(draft_dir, dtype, device, 1, 1)
    return ModelDrafter(whole.layers_only(layers, batch, room), target.vocab_size)
