"""Fixes for vLLM bugs that break batchspec's promises, loaded by vLLM itself in every engine
process through its ``vllm.general_plugins`` entry point (see pyproject.toml), so they reach
the engine core wherever it runs. The same hook binds a worker's engine processes to it
(``engines.tether.arm_engine_process``: they die with it, and close when it asks).

vLLM 0.32's CPU build samples speculatively with the wrong target distribution. Its CPU
stand-in for the Triton ``expand_kernel`` (``vllm.utils.cpu_triton_utils._expand_kernel_impl``)
converts the output tensor to a fresh int64 copy, lets the C++ kernel write into the copy and
drops it. ``expand_batch_to_tokens`` hands it a ``new_empty`` float tensor, so the per-token
temperatures (and top-k/top-p) that the rejection sampler divides the target's logits by are
uninitialised memory: the target's probabilities at draft positions come out NaN, every draft
is "rejected", and the recovered token that replaces it is the draft token itself. Greedy
requests never reach this path. Measured with the embedded model (math-0001 at temperature 1,
200 samples): "Maria has" 57 and "Maria gives" 0 times with n-gram speculation, against 29 and
26 without. The replacement below is the kernel's definition in plain torch.

Its CPU platform also rebinds Triton kernels at every engine start by scanning every loaded
module's namespace (``vllm.triton_utils.dispatcher._rebind_kernels``), reading each object's
``vars()``. llvmlite's ``ffi.lib`` (loaded with numba by the n-gram proposer) answers any
attribute, ``__dict__`` included, with a function wrapper, so a second engine started in the
same process after an n-gram engine fails (``'_lib_fn_wrapper' object has no attribute
'get'``). :func:`rebind_without_lazy_namespaces` hides that module during the scan.

The same hook lets a worker's engine core fork on the CPU (``vllm_fork``), and puts the file
vLLM's workers meet in to set up torch.distributed in the worker's own folder
(``vllm_sockets.file_store_init_method``), which goes with the worker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# Modules whose namespace answers every attribute lookup (so ``vars()`` of their objects is not
# a dict); none of them holds a Triton kernel.
_LAZY_NAMESPACES = ("llvmlite.binding.ffi",)


def expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> Any:
    """``[a, b, c]`` with cumulative counts ``[2, 5, 6]`` → ``[a, a, b, b, b, c]``, any dtype;
    entries equal to ``replace_from`` become ``replace_to`` (greedy rows' temperature 0 → 1)."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def rebind_without_lazy_namespaces(rebind: Callable[[Any], None]) -> Callable[[Any], None]:
    """``rebind`` (vLLM's kernel rebinding scan) run with :data:`_LAZY_NAMESPACES` out of
    ``sys.modules``, put back afterwards whatever happens."""

    def scan(overrides: Any) -> None:
        hidden = {name: sys.modules.pop(name) for name in _LAZY_NAMESPACES if name in sys.modules}
        try:
            rebind(overrides)
        finally:
            sys.modules.update(hidden)

    return scan


def register() -> None:
    """vLLM plugin hook: in a worker's engine processes, die with the worker and close on its
    request, take K changes (``vllm_live_k``), and meet in the worker's folder; on the CPU
    platform, route the rejection
    sampler's expansion through :func:`expand_batch_to_tokens` (GPU builds keep their Triton
    kernel)."""
    from vllm.platforms import current_platform

    from batchspec.engines import vllm_fork
    from batchspec.engines.tether import arm_engine_process
    from batchspec.engines.vllm_live_k import install

    arm_engine_process()
    install()
    from vllm.v1.executor import multiproc_executor, uniproc_executor

    from batchspec.engines.vllm_sockets import file_store_init_method

    for executor in (multiproc_executor, uniproc_executor):
        executor.get_file_store_init_method = file_store_init_method  # type: ignore[attr-defined]
    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    vllm_fork.install()
    from vllm.triton_utils import dispatcher

    if not getattr(dispatcher._rebind_kernels, "__wrapped__", None):
        scan = rebind_without_lazy_namespaces(dispatcher._rebind_kernels)
        scan.__wrapped__ = dispatcher._rebind_kernels  # type: ignore[attr-defined]
        dispatcher._rebind_kernels = scan
