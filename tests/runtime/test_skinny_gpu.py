"""The skinny decode GEMMs on the GPU at one TP8 rank's real shapes against fp32 matmul: plain, gated (the
activation in the epilogue), with an add; repeatable in a CUDA graph; and the layers taking them by themselves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.mx_linear import split_counters
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.kernels.skinny import Gate, skinny_linear
from m3bench.runtime.layers.activation import gated_activation
from m3bench.runtime.layers.linear import set_skinny_rows
from m3bench.runtime.layers.mlp import GatedMLP

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SHAPES = [(1920, 6144), (6144, 1024), (3072, 6144), (6144, 1536), (768, 6144), (6144, 384)]


def _rel(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def _inputs(rows, n, k, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(dtype)
    return w, torch.randn(rows, k, device="cuda", generator=g).to(dtype), g


@pytest.mark.parametrize("rows", [1, 2, 4, 16])
@pytest.mark.parametrize("n, k", SHAPES)
def test_plain_and_added_at_rank_shapes(rows, n, k):
    w, x, g = _inputs(rows, n, k, rows * 7 + n + k)
    want = F.linear(x.float(), w.float())
    assert _rel(skinny_linear(x, w), want) < 1e-2
    add = torch.randn(rows, n, device="cuda", generator=g).to(torch.bfloat16)
    assert _rel(skinny_linear(x, w, add=add), want + add.float()) < 1e-2
    assert not split_counters(x.device).any()


@pytest.mark.parametrize("rows", [1, 4])
def test_fp32_router(rows):
    w, x, _ = _inputs(rows, 128, 6144, rows, torch.float32)
    assert _rel(skinny_linear(x, w), F.linear(x.double(), w.double()).float()) < 1e-5


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("inter", [384, 1536])
def test_gated_at_rank_shapes(rows, inter):
    w, x, _ = _inputs(rows, 2 * inter, 6144, rows + inter)
    gu = F.linear(x.float(), w.float())
    want = gated_activation(Activation.SWIGLUOAI, gu[:, :inter], gu[:, inter:], 1.702, 7.0)
    assert _rel(skinny_linear(x, w, gate=Gate(MoeActivation.SWIGLUOAI, 1.702, 7.0)), want) < 2e-2


def test_split_k_repeats_in_a_cuda_graph():
    w, x, _ = _inputs(1, 1920, 6144, 3)
    out = torch.empty(1, 1920, device="cuda", dtype=torch.bfloat16)
    first = skinny_linear(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(skinny_linear(x, w))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)


def test_gated_mlp_takes_the_kernels_by_itself():
    """On CUDA at a few rows the MLP runs gated gate|up + down with the add; the same layer with skinny_rows 0
    (cuBLAS + gated_act) agrees within bf16 rounding."""
    torch.manual_seed(0)
    layer = GatedMLP(6144, 3072, Activation.SWIGLUOAI, 1.702, 7.0, torch.bfloat16, "cuda")
    for p in layer.parameters():
        p.data.copy_(torch.randn_like(p, dtype=torch.float32) * p.shape[-1] ** -0.5)
    x, add = torch.randn(4, 6144, device="cuda").bfloat16(), torch.randn(4, 6144, device="cuda").bfloat16()
    got = layer(x, KernelBackend.AUTO, add=add)
    set_skinny_rows(layer, 0)
    want = layer(x, KernelBackend.AUTO, add=add)
    assert _rel(got, want.float()) < 2e-2
