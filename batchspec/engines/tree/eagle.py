"""Draft trees from an EAGLE-3 head (``eagle_head.EagleHead``) behind ``drafting.Drafter``,
grown as EAGLE-2 grows them (``drafter.Growth``: top-ranked children, the K nodes of highest
cumulative draft probability kept, one batched head forward per depth).

The head sees pairs: (the target's features at position i, the token at i + 1); its output at
the pair predicts the token at i + 2. So a row's head cache holds one entry per committed
position whose next token is known, and the newest pair is (features of the position before
the root, the root), whose output gives the root's children. A deeper node's pair is (its
parent's head output, its own token), at the position of its depth, behind its ancestors'
entries in scratch (``cache.KVCache`` with one layer, as the draft model's tree grows).

Features come from a ``Features`` source: in the engine, the target's own taps
(``eagle_head.TappedModel``: every prompt position at prefill, the kept nodes at each
commit); offline (held-out acceptance in ``distill``, ``drafting.replay``), a row's features
computed once over its whole sequence (``StoredFeatures``), which is what the engine's
forwards would give for a greedy row. Children are the head's top ranks, chosen
deterministically, so the target verifies them with the one-hot rule: lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from batchspec.engines.tree.cache import KVCache
from batchspec.engines.tree.drafter import Growth, shape_ranks
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.eagle_head import EagleHead, TappedModel, head_rope, load_head
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.shape import DraftTree, batch_layout
from batchspec.models import resolve_model
from batchspec.spec import JobSpec


class Features(Protocol):
    """Where the target's features of committed positions come from."""

    def prompt(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        """[len(prompt), F]: every prompt position's features."""

    def committed(self, slot: int, count: int) -> torch.Tensor:
        """[count, F]: the features of the next ``count`` committed positions."""


class TargetFeatures:
    """The engine's: what the tapped target kept at its last prefill or commit of a slot."""

    def __init__(self, model: TappedModel) -> None:
        self.model = model

    def prompt(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        return self._take(slot, len(prompt))

    def committed(self, slot: int, count: int) -> torch.Tensor:
        return self._take(slot, count)

    def _take(self, slot: int, count: int) -> torch.Tensor:
        got = self.model.take(slot)
        if got is None or got.shape[0] != count:
            have = None if got is None else got.shape[0]
            raise RuntimeError(f"slot {slot}: {count} positions' features wanted, {have} kept")
        return got


class StoredFeatures:
    """One row's features over its whole sequence (prompt and output), handed out in order."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features, self.pos = features, 0

    def prompt(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        self.pos = len(prompt)
        return self.features[: self.pos]

    def committed(self, slot: int, count: int) -> torch.Tensor:
        got = self.features[self.pos : self.pos + count]
        self.pos += count
        return got


class EagleDrafter:
    """Draft trees for the rows in flight from an EAGLE-3 head with a cache of its own."""

    def __init__(self, head: EagleHead, features: Features, max_batch: int, max_len: int):
        self.head, self.features = head, features
        dtype, device = head.fc.dtype, head.fc.device
        self.device = device
        self.cache = KVCache(1, max_batch, head.kv_heads, max_len, head.hd, dtype, device)
        self.rope = head_rope(head.cfg, max_len, dtype, str(device))
        self.group = head.heads // head.kv_heads
        self.vocab = head.cfg.target.vocab_size
        self.ids = head.draft_ids
        self.feats: dict[int, list[torch.Tensor]] = {}
        """Per slot, features of committed positions not yet fed to the head, in order."""
        self.toks: dict[int, list[int]] = {}
        """Per slot, the tokens that pair with them (the next position's); the last is the
        root of the row's next tree."""
        self.prompts: dict[int, torch.Tensor] = {}
        self.fresh: set[int] = set()
        """Slots started since their last ``extend``: the first token has no features yet."""

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        feats = self.prompts[twin] if twin is not None else self.features.prompt(slot, prompt)
        self.prompts[slot] = feats
        self.cache.release(slot)
        self.feats[slot], self.toks[slot] = [feats], list(prompt[1:])
        self.fresh.add(slot)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        if slot in self.fresh:
            self.fresh.discard(slot)
        else:
            self.feats[slot].append(self.features.committed(slot, len(tokens)))
        self.toks[slot].extend(tokens)

    def release(self, slot: int) -> None:
        self.cache.release(slot)
        for state in (self.feats, self.toks, self.prompts):
            state.pop(slot, None)
        self.fresh.discard(slot)

    @torch.inference_mode()
    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        """Each row's tree: its pending pairs fed, then grown depth by depth."""
        growths = []
        for a in asks:
            ranks = shape_ranks(a.budget, a.depth, a.branching, a.paths)
            growths.append(Growth(self.toks[a.slot][-1], a.budget, ranks))
        rows = [(a.slot, g) for a, g in zip(asks, growths, strict=True) if g.frontier]
        if rows:
            outs = self._first(rows)
            active = [(s, g, o) for (s, g), o in zip(rows, outs, strict=True) if g.frontier]
            while active:
                active = [r for r in self._extend(active) if r[1].frontier]
            for slot, _ in rows:
                self.cache.commit(slot, [0])  # the root pair joins the prefix
                self.feats[slot], self.toks[slot] = [], []
        return [g.tree() for g in growths]

    def _logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary log-probabilities [n, vocab] of head outputs [n, hidden]: the
        draft vocabulary's, -inf elsewhere."""
        lp = torch.log_softmax(self.head.logits(out), dim=-1)
        if lp.shape[-1] == self.vocab:
            return lp
        full = lp.new_full((lp.shape[0], self.vocab), float("-inf"))
        full[:, self.ids] = lp
        return full

    def _first(self, rows: list[tuple[int, Growth]]) -> list[dict[int, torch.Tensor]]:
        """Feed each row's pending pairs as a chain; keep all but the root pair; expand the
        root. Per row, node -> head output (the root's)."""
        slots = [s for s, _ in rows]
        feats = [torch.cat(self.feats[s]).to(self.device) for s in slots]
        toks = [self.toks[s] for s in slots]
        chains = [DraftTree(t, list(range(-1, len(t) - 1))) for t in toks]
        lens = [self.cache.lens[s] for s in slots]
        batch = batch_layout(chains, lens)
        n = batch.tokens.shape[1]
        hidden = torch.zeros(len(rows), n, self.head.fc.shape[0], dtype=self.head.fc.dtype)
        hidden = hidden.to(self.device)
        for b, f in enumerate(feats):
            hidden[b, : len(f)] = self.head.project(f)
        out = self._run(slots, batch.tokens, hidden, batch.positions, batch.tree_mask, None)
        outs = []
        for b, ((slot, g), t) in enumerate(zip(rows, toks, strict=True)):
            if len(t) > 1:
                self.cache.commit(slot, list(range(len(t) - 1)))
            last = out[b, len(t) - 1 : len(t)]
            g.expand(self._logprobs(last))
            outs.append({0: last[0]})
        return outs

    def _extend(
        self, rows: list[tuple[int, Growth, dict[int, torch.Tensor]]]
    ) -> list[tuple[int, Growth, dict[int, torch.Tensor]]]:
        """One forward of every row's frontier, behind the nodes fed before: each node's pair
        is (its parent's head output, its token) at its depth's position."""
        frontiers = [list(g.frontier) for _, g, _ in rows]
        feeds = [g.feed() for _, g, _ in rows]
        offsets = [g.used for _, g, _ in rows]
        n = max(len(f) for f in feeds)
        b = len(rows)
        tokens = torch.zeros(b, n, dtype=torch.long)
        positions = torch.zeros(b, n, dtype=torch.long)
        mask = torch.zeros(b, n, max(offsets) + n, dtype=torch.bool)
        hidden = torch.zeros(b, n, self.head.fc.shape[0], dtype=self.head.fc.dtype)
        hidden = hidden.to(self.device)
        for r, ((slot, g, hid), feed, front) in enumerate(zip(rows, feeds, frontiers, strict=True)):
            positions[r] = self.cache.lens[slot]
            for i, ((token, depth, ancestors), node) in enumerate(zip(feed, front, strict=True)):
                tokens[r, i] = token
                positions[r, i] += depth
                mask[r, i, ancestors] = True
                hidden[r, i] = hid[g.parents[node]]
            g.used += len(feed)
        slots = [s for s, _, _ in rows]
        out = self._run(slots, tokens, hidden, positions, mask, offsets)
        for r, ((_, g, hid), front) in enumerate(zip(rows, frontiers, strict=True)):
            for i, node in enumerate(front):
                hid[node] = out[r, i]
            g.expand(self._logprobs(out[r, : len(front)]))
        return rows

    def _run(
        self,
        slots: list[int],
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor,
        offsets: list[int] | None,
    ) -> torch.Tensor:
        """The head over B rows x N pairs against its cache; its outputs [B, N, hidden]."""
        dev = self.device
        tokens, positions, tree_mask = tokens.to(dev), positions.to(dev), tree_mask.to(dev)
        b, n = tokens.shape
        step = self.cache.step(slots, n, offsets)
        mask = self.cache.mask(step, tree_mask, self.group)
        cos, sin = self.rope[:, positions].unsqueeze(3)
        q, k, v = self.head.attn_in(hidden, tokens, cos, sin)
        self.cache.write(0, step, k, v)
        keys, values = self.cache.read(0, step)
        kv, hd = self.head.kv_heads, self.head.hd
        q = q.reshape(b, n, kv, self.group, hd).permute(0, 2, 3, 1, 4)
        o = F.scaled_dot_product_attention(
            q.reshape(b, kv, self.group * n, hd), keys, values, attn_mask=mask
        )
        o = o.view(b, kv, self.group, n, hd).permute(0, 3, 1, 2, 4).reshape(b, n, -1)
        return self.head.attn_out(hidden, o)


def open_eagle_drafter(spec: JobSpec, target: TreeModel, room: int) -> EagleDrafter:
    """The job's head (``speculative.model``) on the target's device, the target tapped at
    the head's feature layers."""
    head_dir = resolve_model(spec.speculative.model or "", "speculative.model", spec.resolve("."))
    head = load_head(head_dir, target)
    tapped = TappedModel.of(target, head.cfg.aux_layers)
    return EagleDrafter(head, TargetFeatures(tapped), spec.model.max_num_seqs, room)
