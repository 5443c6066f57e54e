"""The layers that run the skinny decode GEMMs (Triton interpreter; on CUDA they do so by themselves): the
gated MLP's gate|up with the activation in its epilogue and its down GEMM adding the routed experts' sum, the
column-parallel bias and the row-parallel add, against the same layers on cuBLAS-free torch (skinny_rows 0),
on fresh random inputs."""

import pytest
import torch

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels import skinny
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.layers import linear as linear_mod
from m3bench.runtime.layers import mlp as mlp_mod
from m3bench.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Segment, set_skinny_rows
from m3bench.runtime.layers.mlp import GatedMLP

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def calls(monkeypatch):
    """The layers take the skinny kernel on CPU tensors (the interpreter); every call is recorded."""
    seen = []

    def runs(x, weight, rows):
        return bool(rows) and skinny.skinny_supported(x, weight, rows)

    def recorded(*args, **kwargs):
        seen.append(kwargs.get("gate") is not None)
        return skinny.skinny_linear(*args, **kwargs)

    for mod in (linear_mod, mlp_mod):
        monkeypatch.setattr(mod, "skinny_runs", runs)
        monkeypatch.setattr(mod, "skinny_linear", recorded)
    return seen


def _fill(module, g):
    for p in module.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


@pytest.mark.parametrize("act", [Activation.SWIGLUOAI, Activation.SILU])
@pytest.mark.parametrize("rows", [1, 3])
def test_gated_mlp_with_add_matches_torch(calls, act, rows):
    g = torch.Generator().manual_seed(rows + (act is Activation.SILU) * 10)
    layer = GatedMLP(64, 96, act, 1.702, 7.0, torch.float32, "cpu")
    _fill(layer, g)
    x, add = torch.randn(rows, 64, generator=g), torch.randn(rows, 64, generator=g)
    got = layer(x, KernelBackend.TRITON, add=add)
    assert calls == [True, False]  # gate|up with the activation, then down with the add
    set_skinny_rows(layer, 0)
    want = layer(x, KernelBackend.TORCH, add=add)
    assert len(calls) == 2 and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(want, layer(x, KernelBackend.TORCH) + add, atol=1e-6)


def test_more_rows_than_allowed_stay_on_torch(calls):
    g = torch.Generator().manual_seed(2)
    layer = GatedMLP(64, 32, Activation.SILU, 1.0, 0.0, torch.float32, "cpu")
    _fill(layer, g)
    set_skinny_rows(layer, 2)
    layer(torch.randn(3, 64, generator=g), KernelBackend.TRITON)
    assert calls == []


def test_column_bias_and_row_add_match_torch(calls):
    g = torch.Generator().manual_seed(4)
    col = ColumnParallelLinear(64, (Segment("a", 32), Segment("b", 16)), True, torch.float32, "cpu")
    row = RowParallelLinear(64, 32, "o", False, torch.float32, "cpu")  # reduces (one rank): the add after
    _fill(col, g)
    _fill(row, g)
    x, add = torch.randn(2, 64, generator=g), torch.randn(2, 32, generator=g)
    got_c, got_r = col(x), row(x, add=add)
    assert calls == [False, False]
    assert torch.allclose(got_c, torch.nn.functional.linear(x, col.weight, col.bias), atol=1e-5)
    assert torch.allclose(got_r, torch.nn.functional.linear(x, row.weight) + add, atol=1e-5)
