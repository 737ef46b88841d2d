"""The small-row product kernel (``engines/tree/smallm.py``): every row count, against float64
within float32's error bound, the dispatch by row count, and its build into the cache."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.tiny_model import TINY_TIED

from batchspec.engines.tree import smallm
from batchspec.engines.tree.weights import SMALL_ROWS, Linear

needs_kernel = pytest.mark.skipif(
    smallm.unsupported() is not None, reason=f"no small-row kernel here: {smallm.unsupported()}"
)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHSPEC_CACHE", str(cache))
        smallm.load.cache_clear()
        lib = smallm.load()
    smallm.load.cache_clear()
    assert lib is not None
    return lib


def bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Float32's error bound of a sum of ``in`` products: in x eps x sum |x||w| (a kernel that
    read a wrong weight or input is off by far more)."""
    return x.shape[-1] * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().t())


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 29, 64])
@pytest.mark.parametrize("shape", [(24, 40), (64, 150)])
def test_every_row_count_is_the_product_within_float32s_bound(
    kernel, rows: int, shape: tuple[int, int]
) -> None:
    """Three panels, an input length no vector width divides; then a group of three panels
    and two left over, and inputs in blocks of 64 and a part block (rows 5-8 continue sums)."""
    torch.manual_seed(rows)
    w = torch.randn(*shape)
    x = torch.randn(rows, shape[1])
    got = smallm.Panels(w, kernel)(x)
    exact = x.double() @ w.double().t()
    assert got.shape == (rows, shape[0]) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= bound(x, w)).all()
    # Each output is its own row's and column's: a row or a panel mixed up fails here.
    assert torch.equal(got.argmax(1), exact.argmax(1)) and torch.equal(
        got.argmax(0), exact.argmax(0)
    )


@needs_kernel
def test_linear_takes_the_kernel_for_a_few_rows_only(kernel, monkeypatch) -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    linear = Linear(w, pack=True, kernel=kernel)
    assert linear.small is not None
    calls = []
    real = smallm.Panels.__call__
    monkeypatch.setattr(smallm.Panels, "__call__", lambda s, x: calls.append(x.shape) or real(s, x))
    for rows in (1, 2, 9, SMALL_ROWS, SMALL_ROWS + 1):
        x = torch.randn(1, rows, 32)
        got = linear(x)
        assert got.shape == (1, rows, 64)
        assert torch.allclose(got, F.linear(x, w), atol=1e-4), rows
    assert calls == [(1, 1, 32), (1, 2, 32), (1, 9, 32), (1, SMALL_ROWS, 32)]
    # A matrix of part panels (out not a multiple of 8) stays oneDNN's.
    assert Linear(torch.randn(60, 32), pack=True, kernel=kernel).small is None


def test_switched_off_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(smallm.ENV, "0")
    assert smallm.small_kernel() is None


def test_without_a_compiler_the_products_stay_onednns(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("BATCHSPEC_CACHE", str(tmp_path))
    smallm.load.cache_clear()
    try:
        assert smallm.load() is None
    finally:
        smallm.load.cache_clear()
    assert not (tmp_path / "kernels").exists() or not list((tmp_path / "kernels").iterdir())


@needs_kernel
def test_built_once_into_the_cache_and_loaded_from_there(kernel, tmp_path: Path) -> None:
    code = "from batchspec.engines.tree import smallm; print(smallm.load() is not None)"
    env = {"BATCHSPEC_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert first.stdout.strip() == "True", first.stderr[-2000:]
    (built,) = (tmp_path / "kernels").iterdir()
    assert built.name.startswith("smallm-") and built.suffix == ".so"
    # Now no compiler at all: the cached build is what loads.
    env["CC"] = str(tmp_path / "no-such-cc")
    env["PATH"] = str(tmp_path)
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.stdout.strip() == "True", again.stderr[-2000:]


@needs_kernel
def test_the_output_is_made_on_the_inputs_device_whatever_the_default(kernel) -> None:
    """With the default device ``meta`` (``test_tree_loop`` sets it), an output made without
    naming the device had no memory, and the kernel wrote through a null pointer."""
    w, x = torch.randn(16, 8), torch.randn(3, 8)
    torch.set_default_device("meta")
    try:
        got = smallm.Panels(w, kernel)(x)
    finally:
        torch.set_default_device(None)
    assert got.device.type == "cpu" and torch.allclose(got, x @ w.t(), atol=1e-5)
    with pytest.raises(TypeError, match="float32 on the CPU"):
        smallm.Panels(w, kernel)(x.double())


@needs_kernel
def test_model_forwards_of_a_few_rows_run_in_c_as_the_eager_layers_do(kernel) -> None:
    """``fewrows``: a batch of two rows' trees at different cache lengths, and a draft tree's
    next depth behind scratch nodes (``offsets``), by the two C calls per layer and by the
    eager layers (the float64 comparisons are ``test_tree_model``'s)."""
    from batchspec.engines.tree import weights
    from batchspec.engines.tree.eagle_head import TappedModel
    from batchspec.engines.tree.model import TreeModel

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(weights, "small_kernel", lambda: kernel)
        model = TreeModel.random(TINY_TIED, torch.float32, "cpu", max_batch=2, max_len=64)
    assert model.few_rows is not None and not model.use_one_row_kernel()
    # No plain copy of a layer's matrices beside the panels and oneDNN's packing; the head's
    # stays (the tied embedding gathers from it).
    layers = [m for m in model.weights.linears() if m is not model.weights.head]
    assert all(m.w is None and m.t is None for m in layers)
    assert model.weights.head.t is not None or model.weights.head.w is not None
    model.prefill(0, [5, 9, 2, 7, 1])
    model.prefill(1, [3, 8])
    tokens = torch.tensor([[4, 6, 11], [12, 13, 14]])
    positions = torch.tensor([[5, 6, 6], [2, 3, 4]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(2, 3, 3)
    draft = torch.ones(2, 2, 5, dtype=torch.bool)  # two more nodes behind the three
    few = model.few_rows
    got = [model.verify([0, 1], tokens, positions, mask)]
    got.append(model.verify([0, 1], tokens[:, :2], positions[:, :2] + 1, draft, offsets=[3, 3]))
    model.few_rows = None
    want = [model.verify([0, 1], tokens, positions, mask)]
    want.append(model.verify([0, 1], tokens[:, :2], positions[:, :2] + 1, draft, offsets=[3, 3]))
    model.few_rows = few
    # One row, a transposed embedding's two (a view the forward must copy into rows).
    got.append(model.verify([0], tokens[:1, :2], positions[:1, :2], mask[:1, :2, :2]))
    model.few_rows = None
    want.append(model.verify([0], tokens[:1, :2], positions[:1, :2], mask[:1, :2, :2]))
    model.few_rows = few
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and (g - w).abs().max().item() < 1e-5
    # EAGLE's taps (each layer's input, the last layer's output) as the eager layers show them.
    tapped = TappedModel.of(model, [0, 1, 2])
    tapped.verify([0, 1], tokens, positions, mask)
    taps = tapped.tapped
    tapped.few_rows = None
    tapped.verify([0, 1], tokens, positions, mask)
    assert taps.shape == (2, 3, 3 * 64) and (taps - tapped.tapped).abs().max().item() < 1e-5
