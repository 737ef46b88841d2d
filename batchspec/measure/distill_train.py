"""Training an EAGLE-3 head (``engines/tree/eagle_head``) on a job's rows: the loss, one
row's forward with training-time test, the draft vocabulary, held-out acceptance.

Objective: at every position of prompt and output, the head's draft-vocabulary distribution
against the target's own next-token distribution there (soft cross-entropy; the target's
logits recomputed from its stored last-layer output, restricted to the draft vocabulary as
EAGLE-3 and ``speculators`` do), not only against the token the target sampled.

Training-time test (EAGLE-3): depth 1 feeds the target's features; depth s + 1 feeds the
head's own output of depth s, as drafting does. A query of depth s at position t sees the
depth-1 entries of positions <= t and its own entries of depths 2..s at t (the ancestors a
drafted node sees), which one attention over the concatenated depths with that mask gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from batchspec.engines.tree.drafter import growth_scratch
from batchspec.engines.tree.drafting import replay
from batchspec.engines.tree.eagle import EagleDrafter, StoredFeatures
from batchspec.engines.tree.eagle_head import EagleHead
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.ops import rms_norm
from batchspec.spec.tree import TreeShape

DEPTHS = 3
"""Training-time-test depths (EAGLE-3 trains 7 on GPUs; 3 here keeps a CPU epoch short)."""
DEPTH_DECAY = 0.8
"""Weight of depth s's loss: DEPTH_DECAY ** s."""


def draft_vocab(rows: Sequence[Sequence[int]], size: int, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the rows (then the lowest ids), ascending: the
    draft vocabulary; the whole vocabulary when ``size`` is 0 or at least ``vocab``."""
    if size <= 0 or size >= vocab:
        return torch.arange(vocab)
    counts = Counter(t for r in rows for t in r)
    ranked = [t for t, _ in counts.most_common(size)]
    rest = (t for t in range(vocab) if t not in counts)
    ranked += [t for _, t in zip(range(size - len(ranked)), rest, strict=False)]
    return torch.tensor(sorted(ranked))


class Teacher:
    """The target's distribution over the draft vocabulary from its last-layer output."""

    def __init__(self, norm: torch.Tensor, head_rows: torch.Tensor, eps: float) -> None:
        self.norm, self.rows, self.eps = norm.float(), head_rows.float(), eps

    def probs(self, last: torch.Tensor) -> torch.Tensor:
        return torch.softmax(F.linear(rms_norm(last, self.norm, self.eps), self.rows), -1)


def depth_outputs(
    head: EagleHead, tokens: torch.Tensor, aux: torch.Tensor, rope: torch.Tensor, depths: int
) -> list[torch.Tensor]:
    """The head's outputs [m_s, hidden] at every depth s = 0..depths-1 over a whole row
    (tokens [T], feature layers [T, A x hidden]): depth s's output at t is what drafting
    gives the node at depth s + 1 under the root x[t + 1], its path x[t + 2 .. t + 1 + s]."""
    t_len = tokens.shape[0]
    hidden = head.project(aux[: t_len - 1]).unsqueeze(0)  # pair t: (feature t, token t + 1)
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []
    outs = []
    for s in range(min(depths, t_len - 1)):
        m = t_len - 1 - s
        hidden = hidden[:, :m]
        cos, sin = rope[:, torch.arange(m) + s].unsqueeze(1).unsqueeze(3)
        q, k, v = head.attn_in(hidden, tokens[1 + s : 1 + s + m].unsqueeze(0), cos, sin)
        keys.append((k, v))
        hidden = head.attn_out(hidden, _attend(q, keys, head.heads // head.kv_heads))
        outs.append(hidden[0])
    return outs


def row_loss(
    head: EagleHead, tokens: torch.Tensor, feats: torch.Tensor, teacher: Teacher, rope: torch.Tensor
) -> tuple[torch.Tensor, list[float]]:
    """Loss of one row (tokens [T], features [T, (A + 1) x hidden]: the A feature layers, then
    the last layer's output) over ``DEPTHS`` depths, and each depth's top-1 agreement."""
    hsz = head.cfg.target.hidden_size
    loss, agree = torch.zeros(()), []
    with torch.no_grad():  # position t + 1's distribution, once for every depth
        targets = teacher.probs(feats[1:, -hsz:])
    for s, out in enumerate(depth_outputs(head, tokens, feats[:, :-hsz], rope, DEPTHS)):
        m = out.shape[0]  # depth s's output at t predicts the token at t + 2 + s
        logp = torch.log_softmax(head.logits(out), -1)
        target = targets[s : s + m]
        loss = loss + DEPTH_DECAY**s * -(target * logp).sum(-1).mean()
        agree.append(float((logp.argmax(-1) == target.argmax(-1)).float().mean()))
    return loss, agree


def _attend(q: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]], group: int):
    """Depth s's queries [1, m, heads, hd] over depth 1's keys at positions <= t and depths
    2..s's keys at t exactly; the heads' outputs [1, m, heads x hd]."""
    m = q.shape[1]
    k = torch.cat([kk[:, :m] for kk, _ in keys], 1).transpose(1, 2)
    v = torch.cat([vv[:, :m] for _, vv in keys], 1).transpose(1, 2)
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    diag = torch.eye(m, dtype=torch.bool)
    mask = torch.cat([causal] + [diag] * (len(keys) - 1), 1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
    return o.transpose(1, 2).reshape(1, m, -1)


def held_out_steps(
    head: EagleHead, rows: list[tuple[list[int], list[int], torch.Tensor]], k: int, depth: int
) -> tuple[float, float]:
    """Mean tokens per verify step (accepted + 1) of the head's and of n-gram trees of ``k``
    nodes up to ``depth`` deep, replayed over held-out greedy rows (prompt, output, features
    of the whole row): what the engine's steps would give, without running the target."""
    shape = TreeShape(max_depth=depth)
    got = {"head": [0, 0], "ngram": [0, 0]}
    for prompt, out, feats in rows:
        max_len = len(prompt) + len(out) + growth_scratch(k, depth)
        drafters = {
            "head": EagleDrafter(head, StoredFeatures(feats), 1, max_len),
            "ngram": NgramDrafter(1, 4),
        }
        for name, drafter in drafters.items():
            r = replay(drafter, prompt, out, k, shape, len(out) + 1)
            got[name][0] += sum(r.accepted) + len(r.accepted)
            got[name][1] += len(r.accepted)
    return tuple(a / b if b else 0.0 for a, b in got.values())  # type: ignore[return-value]
