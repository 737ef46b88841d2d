"""EAGLE-3 heads (``engines/tree/eagle*``, ``measure/distill*``): the batched, cached drafter
grows exactly the trees that the head's whole-row forward (the training forward) gives; a
tiny distill (features, one epoch, held-out replay, the checkpoint in the speculators format)
gives a head the tree engine drafts with, and greedy output stays plain decoding's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import job_dict

from batchspec.engines.tree.drafter import Growth, growth_scratch, shape_ranks
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.eagle import EagleDrafter, StoredFeatures, TargetFeatures
from batchspec.engines.tree.eagle_head import (
    NAMES,
    EagleHead,
    TappedModel,
    default_aux_layers,
    head_rope,
    read_head_config,
)
from batchspec.engines.tree.engine import TreeEngine
from batchspec.engines.tree.load import Target
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.shape import batch_layout
from batchspec.measure.distill import Options, fit, measure_held_out, new_head, spread
from batchspec.measure.distill_data import FeatureStore, Row
from batchspec.measure.distill_train import depth_outputs, draft_vocab, held_out_steps
from batchspec.spec import JobSpec
from batchspec.units import RowRequest, RowResult, UnitRequests, WorkUnit

VOCAB, LAYERS, MAX_LEN = 40, 8, 128
TINY = {
    "hidden_size": 32, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": VOCAB,
    "max_position_embeddings": MAX_LEN, "initializer_range": 0.5,
}  # fmt: skip
AUX = default_aux_layers(LAYERS)


pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread


def tiny(batch: int = 3) -> TreeModel:
    torch.manual_seed(0)
    return TreeModel.random(TINY, torch.float32, "cpu", batch, MAX_LEN)


def random_head(target: TreeModel, ids: torch.Tensor) -> EagleHead:
    torch.manual_seed(1)
    head, _ = new_head(target, ids)
    with torch.no_grad():  # larger than training's start, so that trees branch by the head
        for p in (head.fc, head.q, head.k, head.v, head.o, head.gate, head.up, head.down):
            p.normal_(0, 1.0 if p is head.q or p is head.k else 0.3)
    return head.requires_grad_(False)


def features(target: TreeModel, tokens: list[int]) -> torch.Tensor:
    """The feature layers over a whole sequence (slot 2 as scratch)."""
    tapped = TappedModel.of(target, AUX)
    tapped.prefill(2, tokens)
    tapped.release(2)
    got = tapped.take(2)
    assert got is not None
    return got


def reference_tree(head, target, context: list[int], budget: int, depth: int) -> tuple:
    """The tree grown with every node's children from the whole-row forward over the context
    and the node's path (``depth_outputs``), as (tokens, parents)."""
    rope = head_rope(head.cfg, MAX_LEN, torch.float32, "cpu")
    full = torch.full((VOCAB,), float("-inf"))
    g = Growth(context[-1], budget, shape_ranks(budget, depth))
    while g.frontier:
        rows = []
        for node in g.frontier:
            path, up = [], node
            while up > 0:
                path.append(g.tokens[up])
                up = g.parents[up]
            seq = context + path[::-1]
            aux = features(target, seq)  # positions past the context feed no output at t
            outs = depth_outputs(head, torch.tensor(seq), aux, rope, len(path) + 1)
            lp = torch.log_softmax(head.logits(outs[len(path)][len(context) - 2]), -1)
            rows.append(full.index_put((head.draft_ids,), lp))
        g.expand(torch.stack(rows))
    tree = g.tree()
    return tree.tokens, tree.parents


@pytest.mark.parametrize("vocab", [0, 24])
def test_the_batched_cached_head_grows_what_the_whole_row_forward_grows(vocab: int) -> None:
    """Two rows drafted together over three steps, each step's tree exactly the reference's;
    ``vocab`` 24: a reduced draft vocabulary, mapped back through d2t."""
    target = tiny()
    prompts = [[3, 7, 11, 2, 9], [4, 4, 8]]
    ids = draft_vocab(prompts, vocab, VOCAB)
    head = random_head(target, ids)
    tapped = TappedModel.of(target, AUX)
    drafter = EagleDrafter(head, TargetFeatures(tapped), 3, MAX_LEN)
    contexts = [list(p) for p in prompts]
    for slot, prompt in enumerate(prompts):
        tapped.prefill(slot, prompt)
        drafter.start(slot, prompt)
        first = int(ids[(slot * 5 + 3) % len(ids)])
        contexts[slot].append(first)
        drafter.extend(slot, [first])
    for step in range(3):
        trees = drafter.draft([Ask(slot, 4, 3) for slot in range(2)])
        for slot, tree in enumerate(trees):
            assert (tree.tokens, tree.parents) == reference_tree(head, target, contexts[slot], 4, 3)
        # The target verifies each tree (its taps taken at commit): the first child is
        # "accepted" when there is one, and a bonus token follows.
        lens = tapped.cache_len
        batch = batch_layout(trees, [lens[s] for s in range(2)])
        tapped.verify([0, 1], batch.tokens, batch.positions, batch.tree_mask)
        for slot, tree in enumerate(trees):
            kids = tree.children(0)
            path = [kids[0]] if kids else []
            tapped.commit(slot, [0, *path])
            emitted = [tree.tokens[n] for n in path] + [(step * 7 + slot) % VOCAB]
            contexts[slot] += emitted
            drafter.extend(slot, emitted)
    # Offline (held-out replay): features of the whole row give the same tree.
    offline = EagleDrafter(head, StoredFeatures(features(target, contexts[0][:-1])), 1, MAX_LEN)
    offline.start(0, prompts[0])
    offline.extend(0, contexts[0][len(prompts[0]) : len(prompts[0]) + 1])
    offline.extend(0, contexts[0][len(prompts[0]) + 1 :])
    (tree,) = offline.draft([Ask(0, 4, 3)])
    assert (tree.tokens, tree.parents) == reference_tree(head, target, contexts[0], 4, 3)


def test_a_trees_growth_fits_the_draft_scratch_behind_the_longest_row() -> None:
    """Growth feeds nodes it later drops (kept at one depth, displaced at the next), so one
    tree can take more than K + 1 draft-cache positions behind a row; ``growth_scratch``
    bounds it, and the held-out replay drafts at a row's very end inside it (with K + 2
    positions, as before, it failed: "cache full")."""
    torch.manual_seed(0)
    fed: dict[tuple[int, int], int] = {}
    for budget, depth in ((2, 4), (4, 3), (8, 4), (8, 8)):
        for _ in range(50):
            g = Growth(0, budget, shape_ranks(budget, depth))
            while g.frontier:
                n = len(g.feed())
                assert g.used + n <= growth_scratch(budget, depth)  # offset + nodes fed
                g.used += n
                g.expand(torch.log_softmax(3 * torch.randn(n, VOCAB), -1))
            fed[budget, depth] = max(fed.get((budget, depth), 0), g.used)
    assert fed[8, 8] > 8 + 1 and fed[4, 3] > 4 + 1  # more than the old bound
    target = tiny()
    prompt = [3, 7, 11, 2, 9]
    out = [int(t) for t in torch.randint(0, VOCAB, (24,))]
    head = random_head(target, draft_vocab([prompt], 0, VOCAB))
    row = (prompt, out, features(target, prompt + out[:-1]))
    mine, _ = held_out_steps(head, [row], 8, 8)
    assert mine >= 1.0


def plain_rows(target: TreeModel, prompts: list[list[int]], spec: JobSpec) -> list[RowResult]:
    eng = TreeEngine(spec, 0, target=Target(target, Letters(), set(), MAX_LEN - 16))
    return run(eng, prompts)


class Letters:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


class Rows:
    def __init__(self, unit: UnitRequests) -> None:
        self.unit: UnitRequests | None = unit

    def next_unit(self) -> UnitRequests | None:
        unit, self.unit = self.unit, None
        return unit

    def exhausted(self) -> bool:
        return self.unit is None

    def wait(self) -> None:
        return None


def run(eng: TreeEngine, prompts: list[list[int]]) -> list[RowResult]:
    unit = WorkUnit(0, "in.parquet", 0, len(prompts), None, len(prompts))
    reqs = [RowRequest(i, i, None, {}, p) for i, p in enumerate(prompts)]
    out = [r for res in eng.run(Rows(UnitRequests(unit, reqs)), lambda: False) for r in res.results]
    return sorted(out, key=lambda r: r.request.row)


def job(tmp: Path, speculative: dict) -> JobSpec:
    return JobSpec.model_validate(
        job_dict(
            tmp,
            model={"max_num_seqs": 3, "max_model_len": MAX_LEN - 16},
            speculative={"engine": "tree", **speculative},
            sampling={"max_tokens": 24},
        )
    )


def test_a_tiny_distill_gives_a_head_the_tree_engine_drafts_with_losslessly(tmp_path) -> None:
    target = tiny()
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(VOCAB, (10, 6), generator=gen).tolist()
    plain = plain_rows(target, prompts, job(tmp_path, {"method": "none"}))
    pairs = enumerate(zip(prompts, plain, strict=True))
    rows = [Row(i, "d" if i % 2 else "e", p, r.token_ids) for i, (p, r) in pairs]
    train, held = rows[:8], rows[8:]
    tapped = TappedModel.of(target, [*AUX, LAYERS])
    store = FeatureStore(tmp_path / "features", train + held, tapped.taps)
    for chunk in store.missing():
        store.compute(tapped, chunk)
    ids = draft_vocab([r.tokens for r in train], 0, VOCAB)
    head, teacher = new_head(target, ids)
    opts = Options(epochs=1, nodes=(4,), depth=3)
    history = fit(head, teacher, store, len(train), opts, tmp_path / "ckpt.pt")
    assert len(history) == 1 and history[0]["loss"] > 0
    # A restart with the same arguments finds the finished epoch and trains no further.
    assert fit(head, teacher, store, len(train), opts, tmp_path / "ckpt.pt") == history
    held_out = measure_held_out(head, store, len(train), opts)
    assert set(held_out) == {"d", "e"} and held_out["e"]["4"]["head"] >= 1.0
    head.cfg.record = {"held_out": held_out}
    head.save(tmp_path / "head", "tiny", 4)
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == VOCAB
    assert read_head_config(tmp_path / "head").aux_layers == AUX
    vllm_reads(tmp_path / "head")
    spec = job(tmp_path, {"method": "eagle3", "model": str(tmp_path / "head"),
                          "num_speculative_tokens": 4, "adaptive": False,
                          "tree": {"max_depth": 3}})  # fmt: skip
    eng = TreeEngine(spec, 4, target=Target(tiny(), Letters(), set(), MAX_LEN - 16))
    drafted = run(eng, prompts)
    for a, b in zip(plain, drafted, strict=True):
        assert a.token_ids == b.token_ids
    assert all(r.spec is not None and r.spec.drafted > 0 for r in drafted)


def vllm_reads(head: Path) -> None:
    """vLLM's own loader of speculators checkpoints takes the head as an EAGLE-3 draft of a
    Llama target, with its feature layers and draft vocabulary (what ``method: eagle3`` on
    the vLLM engine loads; the weights' names are checked against the loader's below)."""
    pytest.importorskip("vllm")
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    config = SpeculatorsConfig.from_pretrained(str(head))
    assert config.architectures == ["Eagle3LlamaForCausalLM"]
    assert config.eagle_aux_hidden_state_layer_ids == AUX and config.draft_vocab_size == VOCAB
    raw = json.loads((head / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw) == {
        "method": "eagle3",
        "num_speculative_tokens": 4,
    }
    from safetensors import safe_open

    with safe_open(str(head / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    # Eagle3LlamaForCausalLM.load_weights: d2t -> draft_id_to_target_id, t2d skipped, the
    # rest under model. (lm_head as is); q/k/v and gate/up are stacked by their HF names.
    assert names == {*NAMES.values(), "d2t", "t2d"}


def test_a_data_curves_training_rows_are_spread_over_the_domains() -> None:
    """``--train-rows``: parts come domain by domain, so the first N rows would cover a few
    domains; the rows taken go round-robin over them instead."""
    rows = [
        Row(f"{d}{i}", d, [1], [2]) for d, n in (("a", 3), ("b", 2), ("c", 1)) for i in range(n)
    ]
    assert [r.row_id for r in spread(rows, 4)] == ["a0", "b0", "c0", "a1"]
    assert spread(rows, None) == rows and spread(rows, 9) == rows
