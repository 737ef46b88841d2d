"""The tree engine's target model against transformers, and tree verify against plain decoding.

All in float32 on the embedded model. Against transformers' own LlamaForCausalLM the forward
must agree to rounding and greedy tokens must be identical. Tree verify and batching are judged
against the same model run in float64 (a reference free of rounding at float32's scale): every
tree node's logits must be those of its path decoded plainly, and a row batched with another
(different lengths, padding) those of the row alone, each within float32's rounding bound.
"""

from __future__ import annotations

import math

import pytest
import torch

from batchspec.models import embedded_dir, prepare

NAME = "smollm2-135m-instruct"
PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 8302, 28, 2234]
OTHER = [1, 2683, 314, 253, 2017, 30]
U32 = torch.finfo(torch.float32).eps / 2
"""float32's unit roundoff 2**-24: the relative error of one rounded operation."""
HF_TOL = 3e-4
"""Against transformers: the same float32 math summed in another order (fused matrices)."""
TREE = [-1, 0, 0, 1, 1, 2, 3]
"""Parents of a small hand-made tree: root, two children, grandchildren, one great-grandchild."""
TREE_TOKENS = [378, 260, 3100, 1029, 284, 30, 17]
SMALL, SMALL_TOKENS = [-1, 0, 1], [9, 8, 7]
"""A chain of three nodes: the second row of the batched test, padded to TREE's size."""


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


@pytest.fixture(scope="module")
def reference(model):
    """The same model in float64, by the same code: the weights are bfloat16 on disk, so their
    float32 and float64 copies hold the same values. Its logits carry rounding errors of
    ~1e-16 relative, then one rounding to float32 (verify returns float32): u * |logit|, 1/300
    of ``bound``. After ``model``, whose fixture sets the thread count."""
    from batchspec.engines.tree.model import TreeModel

    return TreeModel.load(prepare(NAME), torch.float64, "cpu", max_batch=2, max_len=64)


def bound(model, ref: torch.Tensor) -> float:
    """How far float32 logits may lie from the float64 reference ``ref`` by rounding alone.

    A dot product of n terms rounded in float32 errs by about sqrt(n) * u of its terms'
    magnitude: its n rounding errors are independent and of either sign, so they add like a
    random walk (probabilistic rounding error analysis, Higham & Mary, SIAM J. Sci. Comput.
    2019; the worst case n * u needs errors all of one sign). Each of the 2 x layers sublayers
    (attention, MLP) adds such an error to the residual stream, n at most max(hidden,
    intermediate); independent again, they grow as sqrt(2 x layers). The head carries the last
    hidden state's relative error onto logits whose scale is their largest magnitude. Hence
    sqrt(2 * layers * n) * u * max|logit|: sqrt(60 * 1536) u = 1.8e-5 of max|logit| here,
    3.1e-4 to 5.9e-4 on these logits (max 17 to 33). Errors seen: up to 0.22 of it (9e-5,
    AVX2-only EPYC, 2026-12-04). It assumes the layers do not amplify rounding errors (each
    sublayer sees an RMS-normalised input): a model, not a worst case. A wrong mask or a
    padding leak moves logits by O(1) (17 to 27 when broken on purpose), 10^4 times this.
    """
    cfg = model.cfg
    inner = max(cfg.hidden_size, cfg.intermediate_size)
    return math.sqrt(2 * cfg.num_hidden_layers * inner) * U32 * ref.abs().max().item()


def close(model, ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """float32 logits ``ours`` within ``bound`` of the float64 reference ``ref``. Two float32
    results each within it of one reference are within twice it of each other."""
    err, tol = (ours - ref).abs().max().item(), bound(model, ref)
    assert err <= tol, f"{what}: {err:.3g} from the float64 reference, bound {tol:.3g}"


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


def decode_paths(model, parents: list[int], tokens: list[int]) -> torch.Tensor:
    """Every node's logits [N, vocab] by plain decoding of its path behind slot 0's prompt,
    leaf by leaf in slot 1; slot 1 is left holding the last leaf's path."""
    out = [torch.empty(0)] * len(parents)
    for leaf in [i for i in range(len(parents)) if i not in parents]:
        model.share_prefix(0, 1, model.cache_len[0])
        for node in path(parents, leaf):
            out[node] = decode(model, 1, tokens[node])
    return torch.stack(out)


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


def test_tree_nodes_match_their_paths_and_commit_continues_plainly(model, reference) -> None:
    """Each node of a tree verify against its path decoded plainly (in float64); then the
    committed path (slot 0) and a prefilled row moved to another slot (1 to 3) decode on as
    the reference does."""
    model.prefill(0, PROMPT)
    tree = tree_verify(model, 0, TREE, TREE_TOKENS)
    assert model.cache_len[0] == len(PROMPT), "verify must not advance the cache"
    reference.prefill(0, PROMPT)
    plain = decode_paths(reference, TREE, TREE_TOKENS)
    for node in range(len(TREE)):
        close(model, tree[node], plain[node], f"node {node}")
    keep = path(TREE, 6)  # [0, 1, 3, 6]: nodes move down to depths 1..3
    assert reference.cache_len[1] == len(PROMPT) + len(keep), "the reference ends on node 6"
    close(model, model.prefill(1, PROMPT + [TREE_TOKENS[i] for i in keep]), plain[6], "prefill")
    model.commit(0, keep)
    assert model.cache_len[0] == len(PROMPT) + len(keep)
    assert model.cache_len[1] == len(PROMPT) + len(keep), "commit must not touch other slots"
    model.move(1, 3)  # a row moved to another slot decodes on unchanged
    assert model.cache_len[1] == 0
    token = int(plain[6].argmax())
    for step in range(5):
        ref = decode(reference, 1, token)
        ours, moved = decode(model, 0, token), decode(model, 3, token)
        close(model, ours, ref, f"committed, step {step}")
        close(model, moved, ref, f"moved, step {step}")
        token = int(ref.argmax())
        assert int(ours.argmax()) == int(moved.argmax()) == token, f"step {step}"
    for m, slots in ((model, (0, 3)), (reference, (0, 1))):
        for slot in slots:
            m.release(slot)


@pytest.fixture(scope="module")
def alone(reference) -> list[torch.Tensor]:
    """The batched test's two rows, each verified alone, in float64 (a tree verify alone is
    held to plain decoding by the test above)."""
    reference.prefill(0, PROMPT)
    reference.prefill(1, OTHER)
    rows = [
        tree_verify(reference, 0, TREE, TREE_TOKENS),
        tree_verify(reference, 1, SMALL, SMALL_TOKENS),
    ]
    reference.release(0)
    reference.release(1)
    return rows


@pytest.mark.parametrize("slots", [(2, 0), (1, 2)])
def test_batched_rows_of_different_lengths_and_padding(model, alone, slots) -> None:
    """Two slots (consecutive: the cache is read as a view; else gathered) with prompts of
    different lengths, the second tree padded with nodes that no valid node sees: each row
    as it is alone (the float64 reference)."""
    first, second = slots
    model.prefill(first, PROMPT)
    model.prefill(second, OTHER)
    n, m = len(TREE), len(SMALL)
    lens = torch.tensor([[model.cache_len[first]], [model.cache_len[second]]])
    positions = lens + torch.stack(
        [depths(TREE), torch.cat([depths(SMALL), torch.zeros(n - m, dtype=torch.long)])]
    )
    mask = torch.zeros(2, n, n, dtype=torch.bool)
    mask[0] = ancestors(TREE)
    mask[1, :m, :m] = ancestors(SMALL)
    mask[1, m:, m:] = torch.eye(n - m, dtype=torch.bool)
    for pad in (0, 4321):
        tokens = torch.tensor([TREE_TOKENS, SMALL_TOKENS + [pad] * (n - m)])
        out = model.verify(list(slots), tokens, positions, mask)
        close(model, out[0], alone[0], f"first row, pad {pad}")
        close(model, out[1, :m], alone[1], f"second row, pad {pad}")
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
    fast.few_rows = None  # the one-row regions serve where the C forward is not built
    assert fast.use_one_row_kernel() and fast.cache_len == [0, 0]
    assert (fast.prefill(1, tokens[:1]) - ref[0]).abs().max().item() < 1e-5
    for i in range(1, len(tokens)):
        assert (decode(fast, 1, tokens[i]) - ref[i]).abs().max().item() < 1e-5
    random = TreeModel.random(config, torch.float32, "cpu", max_batch=1, max_len=8)
    assert random.prefill(0, tokens[:4]).shape == (96,)
