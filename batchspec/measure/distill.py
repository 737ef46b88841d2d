"""``batchspec distill``: an EAGLE-3 draft head trained on a job's own committed rows.

committed rows (``distill_data``) -> the target's features over each row, kept on disk in
chunks -> a head (``engines/tree/eagle_head``) trained against the target's distribution at
every position (``distill_train``) -> ``OUT/drafts/<name>/``: config.json and
model.safetensors in the speculators format (``speculative.method: eagle3``,
``speculative.model: <that directory>``), record.json (rows, domains, tokens, loss,
held-out acceptance per domain), and ``checkpoint.pt`` after every epoch: a distill run again
with the same arguments continues from the last finished epoch, and reuses the features.
"""

from __future__ import annotations

import json
import random
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from batchspec.engines.tree.eagle_head import (
    EagleHead,
    HeadConfig,
    TappedModel,
    default_aux_layers,
    head_rope,
)
from batchspec.engines.tree.model import TreeModel
from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.measure.distill_data import MAX_SEQ, FeatureStore, Row, committed_rows
from batchspec.measure.distill_train import Teacher, draft_vocab, held_out_steps, row_loss
from batchspec.models import resolve_model
from batchspec.spec import JobSpec

ROWS_PER_STEP = 4
"""Rows whose gradients add up before an optimizer step."""


@dataclass
class Options:
    """What ``batchspec distill`` was asked for."""

    name: str = "eagle3"
    rows: int | None = None
    train_rows: int | None = None
    """Train on at most this many of the rows not held out; the held-out rows stay those of
    ``rows`` (a data curve measures every point on the same held-out rows)."""
    holdout: float = 0.1
    epochs: int = 2
    vocab: int = 4096
    lr: float = 1e-3
    seed: int = 0
    nodes: tuple[int, ...] = (4, 8)
    depth: int = 6
    minutes: float | None = None
    """Stop training after this long (the epoch in progress ends there)."""


def split(rows: list[Row], holdout: float) -> tuple[list[Row], list[Row]]:
    """(training rows, held-out rows): a fixed fraction by row id, the same on every run."""
    held = [r for r in rows if r.held_out_key < holdout]
    train = [r for r in rows if r.held_out_key >= holdout]
    if not train:
        raise UserError(f"--holdout {holdout}: no rows left to train on ({len(rows)} committed)")
    return train, held


def spread(rows: list[Row], n: int | None) -> list[Row]:
    """At most ``n`` rows taken round-robin over the domains (parts come domain by domain:
    the first ``n`` would be a few domains only)."""
    if n is None or n >= len(rows):
        return rows
    by_domain: dict[object, list[Row]] = {}
    for r in rows:
        by_domain.setdefault(r.domain, []).append(r)
    picked: list[Row] = []
    for i in range(max(len(v) for v in by_domain.values())):
        picked += [v[i] for v in by_domain.values() if i < len(v)]
    return picked[:n]


def load_target(spec: JobSpec) -> TreeModel:
    """The job's target in float32 on the CPU (features in full precision), one slot."""
    model_dir = resolve_model(spec.model.model, "model.model", spec.resolve("."), True)
    return TreeModel.load(model_dir, torch.float32, "cpu", 1, MAX_SEQ + 8)


def new_head(target: TreeModel, ids: torch.Tensor) -> tuple[EagleHead, Teacher]:
    """A head over the draft vocabulary ``ids``: output rows and norm from the target's,
    the rest drawn small; and the teacher over the same vocabulary."""
    w, cfg = target.weights, target.cfg
    matrix = w.head.w if w.head.w is not None else w.head.t.t()
    rows = matrix[ids].float().clone()
    embed = w.embedding(torch.arange(cfg.vocab_size)).float().clone()
    aux = default_aux_layers(cfg.num_hidden_layers)
    head = EagleHead(HeadConfig(cfg, aux, len(ids)), embed)
    with torch.no_grad():
        head.lm_head.copy_(rows)
        head.norm.copy_(w.norm.float())
        head.d2t.copy_(ids - torch.arange(len(ids)))
    return head, Teacher(w.norm, rows, cfg.rms_norm_eps)


def distill(
    spec: JobSpec, opts: Options, echo: Callable[[str], None] = print
) -> tuple[Path, dict[str, Any]]:
    """Train the head and write it; returns its directory and its record."""
    started = time.perf_counter()
    out = OutDir(spec.output_dir)
    dest = out.root / "drafts" / opts.name
    rows, _ = committed_rows(spec, out, opts.rows)
    train, held = split(rows, opts.holdout)
    train = spread(train, opts.train_rows)
    echo(f"distill: {len(train)} rows to train on, {len(held)} held out -> {dest}")
    target = load_target(spec)
    aux = default_aux_layers(target.cfg.num_hidden_layers)
    tapped = TappedModel.of(target, [*aux, target.cfg.num_hidden_layers])
    store = FeatureStore(dest / "features", train + held, tapped.taps)
    for chunk in tqdm(store.missing(), desc="target features", unit="chunk", leave=False):
        store.compute(tapped, chunk)
    feature_s = time.perf_counter() - started
    ids = draft_vocab([r.tokens for r in train], opts.vocab, target.cfg.vocab_size)
    head, teacher = new_head(target, ids)
    del target, tapped
    losses = fit(head, teacher, store, len(train), opts, dest / "checkpoint.pt")
    record = {
        "architecture": "EAGLE-3 (one decoder layer, features of layers "
        f"{aux}, draft vocabulary {len(ids)})",
        "method": "eagle3",
        "rows": {"train": len(train), "held_out": len(held)},
        "domains": dict(Counter(str(r.domain) for r in train)),
        "tokens": {"train": sum(len(r.tokens) for r in train)},
        "epochs": losses,
        "held_out": measure_held_out(head, store, len(train), opts),
        "seconds": {"features": round(feature_s, 1), "total": 0.0},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    record["seconds"]["total"] = round(time.perf_counter() - started, 1)
    head.cfg.record = record
    head.save(dest, spec.model.model, max(opts.nodes))
    return dest, record


def fit(
    head: EagleHead, teacher: Teacher, store: FeatureStore, n_train: int, opts: Options, ckpt: Path
) -> list[dict[str, Any]]:
    """``opts.epochs`` passes over the training rows (the first ``n_train`` of the store),
    chunks and rows in a seeded order; resumes from ``ckpt`` when it is this run's."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0)
    rope = head_rope(head.cfg, MAX_SEQ + 8, torch.float32, "cpu")
    key = f"{store.key}-{opts.vocab}-{opts.lr}-{opts.seed}"
    history: list[dict[str, Any]] = []
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["key"] == key:
            head.load_state_dict(saved["head"])
            opt.load_state_dict(saved["opt"])
            history = saved["history"]
    order = random.Random(opts.seed)
    bar = tqdm(total=n_train * opts.epochs, initial=n_train * len(history), unit="row")
    stop = time.monotonic() + opts.minutes * 60 if opts.minutes else float("inf")
    for epoch in range(len(history), opts.epochs):
        chunks = list(range(len(store.chunks())))
        order.shuffle(chunks)
        total, agree, seen = 0.0, [0.0] * 3, 0
        for chunk in chunks:
            for i, tokens, feats in store.read(chunk):
                if i >= n_train or tokens.shape[0] < 3 or time.monotonic() > stop:
                    continue
                loss, acc = row_loss(head, tokens, feats, teacher, rope)
                (loss / ROWS_PER_STEP).backward()
                seen += 1
                total += float(loss.detach())
                agree = [a + b for a, b in zip(agree, acc + [0.0] * 3, strict=False)]
                if seen % ROWS_PER_STEP == 0:
                    opt.step()
                    opt.zero_grad()
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{total / seen:.3f}")
        opt.step()
        opt.zero_grad()
        n = max(seen, 1)
        history.append(
            {
                "epoch": epoch + 1,
                "rows": seen,
                "loss": total / n,
                "top1_agreement": [a / n for a in agree],
            }
        )
        state = {"key": key, "head": head.state_dict(), "opt": opt.state_dict()}
        torch.save({**state, "history": history}, ckpt)
    bar.close()
    return history


def measure_held_out(
    head: EagleHead, store: FeatureStore, n_train: int, opts: Options
) -> dict[str, dict[str, dict[str, float]]]:
    """Per domain and node count: mean tokens per verify step of the head's and of n-gram
    trees on the held-out rows (replayed; ``distill_train.held_out_steps``)."""
    hsz = head.cfg.target.hidden_size
    by_domain: dict[str, list[tuple[list[int], list[int], torch.Tensor]]] = {}
    for chunk in range(len(store.chunks())):
        for i, _, feats in store.read(chunk):
            row = store.rows[i]
            if i < n_train or len(row.prompt) + len(row.output) > MAX_SEQ:
                continue
            entry = (row.prompt, row.output, feats[:, :-hsz])
            by_domain.setdefault(str(row.domain), []).append(entry)
    out: dict[str, dict[str, dict[str, float]]] = {}
    head.eval()
    for domain, rows in sorted(by_domain.items()):
        out[domain] = {}
        for k in opts.nodes:
            mine, ngram = held_out_steps(head, rows, k, opts.depth)
            out[domain][str(k)] = {"head": round(mine, 3), "ngram": round(ngram, 3)}
    return out


def summary(record: dict[str, Any]) -> str:
    """The lines ``batchspec distill`` prints at the end."""
    lines = [f"{record['architecture']}; {json.dumps(record['rows'])}"]
    for e in record["epochs"]:
        agree = ", ".join(f"{a:.2f}" for a in e["top1_agreement"])
        lines.append(
            f"epoch {e['epoch']} ({e.get('rows')} rows): loss {e['loss']:.3f}, "
            f"top-1 agreement by depth {agree}"
        )
    for domain, per_k in record["held_out"].items():
        cells = [f"{k} nodes {v['head']:.2f} (n-gram {v['ngram']:.2f})" for k, v in per_k.items()]
        lines.append(f"held out, {domain}: tokens per step " + ", ".join(cells))
    return "\n".join(lines)
