"""CUDA graphs of the tree engine's verify forwards (``engines.tree.graphs``), checked on the
CPU: which bucket a step falls in, how it is padded, that padding changes no real row's
logits (bitwise, whatever the pad rows and nodes hold), and the engine's greedy trees equal
to plain decoding through the padded forward. The capture itself needs a GPU
(``scripts/checks/device_graphs.py``); everything it replays runs here uncaptured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tree_loop import NGRAM, TINY, cycle_model, engine, random_prompts, run, same_rows

from batchspec.engines.tree import graphs
from batchspec.engines.tree.graphs import Bucket, CudaGraphs, pad, plan
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.shape import DraftTree, batch_layout

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # matrices this small: one thread


@pytest.mark.parametrize(
    ("slots", "nodes", "lens", "bucket"),
    [
        ([0], 1, [10, 0, 0, 0, 0, 0], Bucket(1, 1, 128)),  # plain decoding at batch 1
        ([0], 5, [200, 0, 0, 0, 0, 0], Bucket(1, 8, 256)),  # K=4: 5 nodes in 8, 208 -> 256
        ([2, 0], 3, [9, 0, 30, 0, 0, 0], Bucket(4, 4, 128)),  # free slots 1 and 3 pad
        ([4], 1, [0, 0, 0, 0, 9, 0], Bucket(6, 1, 128)),  # 5 slots: max_batch 6, not 8
        ([1], 1, [5, 9, 0, 0, 0, 0], Bucket(1, 1, 128, gather=True)),  # slot 0 is in use
        ([1, 2], 1, [5, 9, 3, 0, 0, 0], None),  # two rows beside a row outside the step
        ([0], 65, [1, 0, 0, 0, 0, 0], Bucket(1, 128, 256)),  # one row: up to MAX_PREFILL
        ([0, 1], 65, [1, 1, 0, 0, 0, 0], None),  # more nodes than MAX_NODES for two rows
        ([0], 513, [0, 0, 0, 0, 0, 0], None),  # more than MAX_PREFILL
        ([0], 8, [290, 0, 0, 0, 0, 0], Bucket(1, 8, 300)),  # the span capped at max_len
        ([0], 9, [290, 0, 0, 0, 0, 0], None),  # 16 padded nodes overrun the cache
    ],
)
def test_a_step_falls_in_the_bucket_of_its_window_nodes_and_span(slots, nodes, lens, bucket):
    assert plan(slots, nodes, lens, max_batch=6, max_len=300) == bucket


def test_padding_puts_rows_at_their_slots_and_pad_nodes_alone():
    tree = DraftTree([5, 6, 7], [-1, 0, 0])
    batch = batch_layout([tree, DraftTree([9], [-1])], [4, 2])
    ints, mask = pad(Bucket(4, 4, 128), [2, 0], batch.tokens, batch.positions,
                     batch.tree_mask, [2, 0, 4, 0])  # fmt: skip
    tokens, positions = ints[:16].view(4, 4), ints[16:32].view(4, 4)
    assert tokens.tolist() == [[9, 0, 0, 0], [0] * 4, [5, 6, 7, 0], [0] * 4]
    assert positions.tolist() == [[2, 2, 2, 2], [0] * 4, [4, 5, 5, 4], [0] * 4]
    assert ints[32:36].tolist() == [2, 0, 4, 0]  # lens, window slot by slot
    assert ints[36:40].tolist() == [2, 0, 1, 3]  # output rows: the step's slots, then pads
    assert ints[40:].tolist() == [0, 1, 2, 3]  # the slots each row reads: the window
    assert mask[2, :3, :3].tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert torch.equal(mask[2, 3], torch.tensor([False, False, False, True]))
    assert torch.equal(mask[1], torch.eye(4, dtype=torch.bool))


def rows_in_flight() -> tuple[TreeModel, list[int], tuple[torch.Tensor, ...]]:
    """A tiny random model with rows in slots 2 and 0 (1 and 3 free), and a verify of a
    3-node tree and a root alone, the rows out of slot order."""
    gen = torch.Generator().manual_seed(0)
    model = TreeModel.random(TINY, torch.float32, "cpu", 4, 64)
    for slot, n in ((0, 9), (2, 21)):
        model.prefill(slot, torch.randint(TINY["vocab_size"], (n,), generator=gen).tolist())
    trees = [DraftTree([3, 4, 5], [-1, 0, 1]), DraftTree([6], [-1])]
    batch = batch_layout(trees, [21, 9])
    return model, [2, 0], (batch.tokens, batch.positions, batch.tree_mask)


def test_padded_forward_gives_eagers_logits_and_pads_change_no_real_row(monkeypatch):
    """Eager against the padded forward (4 slots x 4 nodes x 128 keys for 2 rows x 3 nodes):
    within float32 rounding. Then garbage in the free slots' cache and in every pad node's
    token and position: the real rows' logits bitwise unchanged."""
    model, slots, inputs = rows_in_flight()
    eager = model.verify(slots, *inputs)
    model.graphs = CudaGraphs(model, capture=False)
    padded = model.verify(slots, *inputs)
    assert model.graphs.replays == 1 and model.graphs.eager == 0
    assert list(model.graphs.buckets) == [Bucket(4, 4, 64)]
    torch.testing.assert_close(padded[0, :3], eager[0, :3], rtol=0, atol=1e-5)
    torch.testing.assert_close(padded[1, :1], eager[1, :1], rtol=0, atol=1e-5)

    real_pad = graphs.pad

    def noisy_pad(bucket, slots, tokens, positions, tree_mask, lens):
        ints, mask = real_pad(bucket, slots, tokens, positions, tree_mask, lens)
        cells = bucket.batch * bucket.nodes
        real = torch.zeros(bucket.batch, bucket.nodes, dtype=torch.bool)
        for b, s in enumerate(slots):
            real[s, : int(inputs[2][b].diagonal().sum())] = True
        noise = torch.randint(1, 30, (2, cells), generator=torch.Generator().manual_seed(1))
        for part in range(2):  # tokens, then positions
            view = ints[part * cells : (part + 1) * cells]
            view[~real.view(-1)] = noise[part][~real.view(-1)]
        return ints, mask

    monkeypatch.setattr(graphs, "pad", noisy_pad)
    for free in (1, 3):
        model.cache.k[:, free].normal_()
        model.cache.v[:, free].normal_()
    again = model.verify(slots, *inputs)
    assert torch.equal(again[0, :3], padded[0, :3]) and torch.equal(again[1, :1], padded[1, :1])


def test_a_capture_that_fails_leaves_every_forward_to_the_eager_path(monkeypatch):
    """Whatever stops a capture (here the side stream), the step is computed eagerly, the
    stream the capture left current is restored, and no bucket is tried again."""
    model, slots, inputs = rows_in_flight()
    eager = model.verify(slots, *inputs)
    restored = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "caller's stream")
    monkeypatch.setattr(torch.cuda, "set_stream", restored.append)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: 1 / 0)
    model.graphs = CudaGraphs(model)
    for _ in range(2):
        assert torch.equal(model.verify(slots, *inputs), eager)
    assert restored == ["caller's stream"] and "ZeroDivisionError" in model.graphs.failed
    assert model.graphs.eager == 2 and not model.graphs.buckets


def test_greedy_trees_through_the_padded_forward_are_plain_decoding():
    """The engine at batch 4, K=4 n-gram trees against K=0, both through the padded forward:
    identical rows; 6 rows in 4 slots finish at different steps, so the tail's windows pad
    free slots, and every step has its bucket (none left to the eager path)."""
    rows = random_prompts(6, 10, seed=2)
    torch.manual_seed(0)
    model = cycle_model(4, noise=0.1)
    model.graphs = CudaGraphs(model, capture=False)
    plain = run(engine(model, 0, NGRAM, {7}), rows)
    tree_engine = engine(model, 4, NGRAM, {7})
    tree = run(tree_engine, rows)
    same_rows(plain, tree)
    assert sum(r.spec.accepted for r in tree if r.spec) > 0
    assert {b.nodes for b in model.graphs.buckets} >= {1, 8}
    assert model.graphs.replays > 50 and model.graphs.eager == 0


def test_the_device_check_runs_on_the_cpu(tmp_path, full: bool):
    """``scripts/checks/device_graphs.py --device cpu``: tiny shapes, the padded forward
    uncaptured; its checks pass and its last line is the T4 line. ~8 s of CPU, most of it
    importing torch, transformers and the spec: with ``--full`` only (the tests above check
    the same forward in this process)."""
    if not full:
        pytest.skip("the device check's CPU run: ~8 s, runs with --full")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/checks/device_graphs.py"), "--device", "cpu",
         "--out", str(tmp_path), "--reps", "2", "--tokens", "16"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("T4: plain decode ") and "verify 1x16 / plain" in last, out.stdout
    assert (tmp_path / "device_graphs.txt").read_text().strip().endswith(last)


@pytest.mark.parametrize(("slot", "length"), [(1, 37), (3, 600)])
def test_a_prefill_beside_rows_in_flight_replays_a_bucket_of_its_own_slot(slot, length):
    """A prompt prefilled into a slot whose window holds rows in flight (slots 0 and 2) goes
    by its slot (a gather bucket of one row), in chunks of up to 512 nodes: the last logits
    and the slot's K/V as eager's within float32 rounding, the other rows' caches bitwise
    untouched, and the next verify of every row the same."""
    gen = torch.Generator().manual_seed(3)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = TreeModel.random(TINY, torch.float32, "cpu", 4, 700)
        for busy, n in ((0, 9), (2, 21)):
            model.prefill(busy, torch.arange(5, 5 + n).tolist())
        models.append(model)
    eager, padded = models
    padded.graphs = CudaGraphs(padded, capture=False)
    prompt = torch.randint(TINY["vocab_size"], (length,), generator=gen).tolist()
    before = padded.cache.k[:, [0, 2]].clone()
    want, got = eager.prefill(slot, prompt), padded.prefill(slot, prompt)
    chunks = (length + 511) // 512
    assert padded.graphs.replays == chunks and padded.graphs.eager == 0
    assert all(b.gather and b.batch == 1 for b in padded.graphs.buckets)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    k = (padded.cache.k[:, slot, :, :length], eager.cache.k[:, slot, :, :length])
    torch.testing.assert_close(*k, rtol=0, atol=1e-5)
    assert torch.equal(padded.cache.k[:, [0, 2]], before)
    slots, tokens = [0, 2, slot], torch.tensor([[7], [8], [9]])
    positions = torch.tensor([[9], [21], [length]])
    mask = torch.ones(3, 1, 1, dtype=torch.bool)
    after = [m.verify(slots, tokens, positions, mask) for m in (padded, eager)]
    torch.testing.assert_close(*after, rtol=0, atol=1e-5)
