"""The tree engine's target model against transformers, and tree verify against plain decoding.

All in float32 on the embedded model, where the forward must agree with transformers' own
LlamaForCausalLM to rounding (1e-4 on logits of magnitude ~20) and greedy tokens must be
identical; every tree node's logits must equal those of its path run as a plain sequence.
"""

from __future__ import annotations

import pytest
import torch

from batchspec.models import embedded_dir, prepare

NAME = "smollm2-135m-instruct"
PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 8302, 28, 2234]
OTHER = [1, 2683, 314, 253, 2017, 30]
TOL = 2e-4
"""The same float32 math, batched or alone: GEMM blocking differs with the row count (logits
of ~20 differ by < 1e-4 with AVX-512, 1.1e-4 on an AVX2-only EPYC); a padding leak is O(1)."""
HF_TOL = 3e-4
"""Against transformers: the same float32 math summed in another order (fused matrices)."""
TREE = [-1, 0, 0, 1, 1, 2, 3]
"""Parents of a small hand-made tree: root, two children, grandchildren, one great-grandchild."""
TREE_TOKENS = [378, 260, 3100, 1029, 284, 30, 17]


def ancestors(parents: list[int]) -> torch.Tensor:
    """mask[i, j] iff j is i or an ancestor of i, by hand (independent of shape.py)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def path(parents: list[int], node: int) -> list[int]:
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


def depths(parents: list[int]) -> torch.Tensor:
    return torch.tensor([len(path(parents, i)) - 1 for i in range(len(parents))])


@pytest.fixture(scope="module")
def model():
    """One thread: the suite runs a test file per core, and two threads per process on a busy
    core make every small matrix product wait on the other thread (10x slower here)."""
    from batchspec.engines.tree.model import TreeModel

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield TreeModel.load(prepare(NAME), torch.float32, "cpu", max_batch=4, max_len=128)
    torch.set_num_threads(threads)


def decode(model, slot: int, token: int) -> torch.Tensor:
    """One plain decoding step: verify one node, keep it."""
    pos = torch.tensor([[model.cache_len[slot]]])
    logits = model.verify([slot], torch.tensor([[token]]), pos, torch.ones(1, 1, 1, dtype=bool))
    model.commit(slot, [0])
    return logits[0, 0]


def tree_verify(model, slot: int, parents: list[int], tokens: list[int]) -> torch.Tensor:
    pos = (model.cache_len[slot] + depths(parents)).unsqueeze(0)
    mask = ancestors(parents).unsqueeze(0)
    return model.verify([slot], torch.tensor([tokens]), pos, mask)[0]


def test_greedy_decoding_matches_transformers(model) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(embedded_dir(NAME)), dtype=torch.float32)
    with torch.inference_mode():
        out = hf(torch.tensor([PROMPT]), use_cache=True)
        ours = model.prefill(0, PROMPT)
        ref = out.logits[0, -1]
        for step in range(20):
            assert (ours - ref).abs().max().item() < HF_TOL, f"step {step}"
            token = int(ref.argmax())
            assert int(ours.argmax()) == token, f"step {step}"
            out = hf(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
            ref = out.logits[0, -1]
            ours = decode(model, 0, token)
    assert model.cache_len[0] == len(PROMPT) + 20
    model.release(0)


def test_tree_nodes_match_their_paths_and_commit_continues_plainly(model) -> None:
    model.prefill(0, PROMPT)
    tree = tree_verify(model, 0, TREE, TREE_TOKENS)
    assert model.cache_len[0] == len(PROMPT), "verify must not advance the cache"
    for node in range(len(TREE)):
        seq = PROMPT + [TREE_TOKENS[i] for i in path(TREE, node)]
        plain = model.prefill(1, seq)
        assert (tree[node] - plain).abs().max().item() < TOL, f"node {node}"
    keep = path(TREE, 6)  # [0, 1, 3, 6]: nodes move down to depths 1..3
    model.commit(0, keep)
    assert model.cache_len[0] == len(PROMPT) + len(keep)
    assert model.cache_len[1] == len(PROMPT) + len(keep), "commit must not touch other slots"
    model.move(1, 3)  # a row moved to another slot decodes on unchanged
    assert model.cache_len[1] == 0
    token = int(tree[6].argmax())
    for step in range(5):
        ours, plain = decode(model, 0, token), decode(model, 3, token)
        assert (ours - plain).abs().max().item() < TOL, f"step {step}"
        assert int(ours.argmax()) == int(plain.argmax())
        token = int(ours.argmax())
    model.release(0)
    model.release(3)


@pytest.mark.parametrize("slots", [(2, 0), (1, 2)])
def test_batched_rows_of_different_lengths_and_padding(model, slots: tuple[int, int]) -> None:
    """Two slots (consecutive: the cache is read as a view; else gathered) with prompts of
    different lengths, the second tree padded with nodes that no valid node sees."""
    first, second = slots
    small, small_tokens = [-1, 0, 1], [9, 8, 7]
    model.prefill(first, PROMPT)
    model.prefill(second, OTHER)
    alone = [
        tree_verify(model, first, TREE, TREE_TOKENS),
        tree_verify(model, second, small, small_tokens),
    ]
    n = len(TREE)
    lens = torch.tensor([[model.cache_len[first]], [model.cache_len[second]]])
    positions = lens + torch.stack([depths(TREE), torch.tensor([0, 1, 2, 0, 0, 0, 0])])
    mask = torch.zeros(2, n, n, dtype=torch.bool)
    mask[0] = ancestors(TREE)
    mask[1, :3, :3] = ancestors(small)
    mask[1, 3:, 3:] = torch.eye(n - 3, dtype=torch.bool)
    for pad in (0, 4321):
        tokens = torch.tensor([TREE_TOKENS, small_tokens + [pad] * (n - 3)])
        out = model.verify(list(slots), tokens, positions, mask)
        assert (out[0] - alone[0]).abs().max().item() < TOL
        assert (out[1, :3] - alone[1]).abs().max().item() < TOL
    model.release(first)
    model.release(second)


def test_untied_head_grouped_heads_and_scaled_rope_match_transformers(tmp_path) -> None:
    """A tiny random Llama with what the embedded model lacks (an untied head, two query
    heads per KV head, Llama-3 RoPE scaling), saved by transformers and loaded back."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from batchspec.engines.tree.model import TreeModel

    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 96,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    }
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(str(tmp_path))
    hf = LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ours = TreeModel.load(tmp_path, torch.float32, "cpu", max_batch=1, max_len=64)
    tokens = [3, 17, 42, 5, 88, 61, 7, 20, 33, 9]
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens])).logits[0]
    assert (ours.prefill(0, tokens[:6]) - ref[5]).abs().max().item() < 1e-5
    for i in range(6, len(tokens)):
        assert (decode(ours, 0, tokens[i]) - ref[i]).abs().max().item() < 1e-5
    # Batch-1 decoding by the compiled one-row regions (onerow.py): the same logits.
    fast = TreeModel.load(tmp_path, torch.float32, "cpu", max_batch=2, max_len=64)
    assert fast.use_one_row_kernel() and fast.cache_len == [0, 0]
    assert (fast.prefill(1, tokens[:1]) - ref[0]).abs().max().item() < 1e-5
    for i in range(1, len(tokens)):
        assert (decode(fast, 1, tokens[i]) - ref[i]).abs().max().item() < 1e-5
    random = TreeModel.random(config, torch.float32, "cpu", max_batch=1, max_len=8)
    assert random.prefill(0, tokens[:4]).shape == (96,)
