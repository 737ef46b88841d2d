"""batchspec's fix for vLLM's CPU speculative sampling (``engines.vllm_fixes``): the expansion
of per-request sampling parameters to draft positions, exactly, and its registration as a
vLLM plugin so that every engine process gets it. test_verify.py shows the end result: real
n-gram speculation passes the sampled two-sample test."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch

from batchspec.engines import vllm_fixes

CU = torch.tensor([2, 5, 6], dtype=torch.int32)


def test_expands_any_dtype_and_replaces_greedy_temperature() -> None:
    temps = torch.tensor([0.7, 1.3, 0.0])
    got = vllm_fixes.expand_batch_to_tokens(temps, CU, 6, replace_from=0, replace_to=1)
    assert got.dtype == torch.float32
    assert got.tolist() == torch.tensor([0.7, 0.7, 1.3, 1.3, 1.3, 1.0]).tolist()
    top_k = torch.tensor([5, 0, 40], dtype=torch.int32)
    got = vllm_fixes.expand_batch_to_tokens(top_k, CU, 6)
    assert got.dtype == torch.int32 and got.tolist() == [5, 5, 0, 0, 0, 40]


def test_requests_without_drafts_take_no_positions() -> None:
    got = vllm_fixes.expand_batch_to_tokens(
        torch.tensor([0.5, 0.9, 0.2]), CU.new_tensor([0, 3, 3]), 3
    )
    assert got.tolist() == torch.tensor([0.9, 0.9, 0.9]).tolist()


def test_registered_as_a_vllm_plugin_and_patches_the_cpu_sampler() -> None:
    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("batchspec_fixes") == "batchspec.engines.vllm_fixes:register"
    from vllm.v1.sample import rejection_sampler

    vllm_fixes.register()
    assert rejection_sampler.expand_batch_to_tokens is vllm_fixes.expand_batch_to_tokens
