"""MXFP8 / NVFP4 kernels on the GPU at one TP8 rank's real shapes, against dequantize-then-matmul in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, fused_moe, moe_tiles
from m3bench.runtime.kernels.mx_linear import MxKernel, mx_tiles, split_counters
from m3bench.runtime.kernels.mxfp8 import linear_tiles, mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
T = KernelBackend.TRITON


def _rel(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("n, k", [(1536, 6144), (6144, 1024), (6144, 384)])
def test_mxfp8_linear_rank_shapes(batch, n, k):
    g = torch.Generator(device="cuda").manual_seed(batch + n)
    w, s = quant.quant_mxfp8(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5)
    x = torch.randn(batch, k, device="cuda", generator=g).to(torch.bfloat16)
    want = F.linear(x.float(), quant.dequant_mxfp8(w, s, torch.float32))
    assert _rel(mxfp8_linear(x, w, s, backend=T), want) < 1e-2


@pytest.mark.parametrize("batch", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("n, k", [(1536, 6144), (6144, 1024), (3072, 6144), (6144, 1536), (768, 6144), (6144, 384)])
def test_decode_kernels_and_the_first_kernel_at_rank_shapes(batch, n, k):
    """Both new kernels where they apply (GEMV to 4 rows), and the first kernel, on the same inputs."""
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + n + k)
    w, s = quant.quant_mxfp8(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5)
    x = torch.randn(batch, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    want = F.linear(x.float(), quant.dequant_mxfp8(w, s, torch.float32), b.float())
    kernels = [MxKernel.GEMV, MxKernel.DOT] if batch <= 4 else [MxKernel.DOT]
    for tiles in [mx_tiles(batch, n, k, kern) for kern in kernels] + [linear_tiles(batch, n, k)]:
        got = mxfp8_linear(x, w, s, b, backend=T, tiles=tiles)
        assert got.dtype == torch.bfloat16 and _rel(got, want) < 1e-2, tiles
    assert not split_counters(x.device).any()


def test_split_k_is_deterministic_in_a_cuda_graph():
    """Replays of a captured split-K GEMM give bit-identical results and leave the counters zero."""
    g = torch.Generator(device="cuda").manual_seed(3)
    w, s = quant.quant_mxfp8(torch.randn(1536, 6144, device="cuda", generator=g) * 6144 ** -0.5)
    x = torch.randn(1, 6144, device="cuda", generator=g).to(torch.bfloat16)
    assert mx_tiles(1, 1536, 6144).split_k > 1
    first = mxfp8_linear(x, w, s, backend=T)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mxfp8_linear(x, w, s, backend=T)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, first) and not split_counters(x.device).any()


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("batch", [1, 4, 16, 64])
def test_quantized_moe_rank_shapes(fmt, batch):
    g = torch.Generator(device="cuda").manual_seed(batch)
    e, i, h = 16, 3072, 6144
    gu = torch.randn(e, 2 * i, h, device="cuda", generator=g) * h ** -0.5
    d = torch.randn(e, h, i, device="cuda", generator=g) * i ** -0.5
    if fmt == "mxfp8":
        (qgu, sgu), (qd, sd) = quant.quant_mxfp8(gu), quant.quant_mxfp8(d)
        scales = MoeScales(sgu[:, :i], sgu[:, i:], sd)
    else:
        parts = [[quant.quant_nvfp4(t[x]) for x in range(e)] for t in (gu, d)]
        qgu, qd = (torch.stack([p[0] for p in ps]) for ps in parts)
        sgu, sd = (torch.stack([p[1] for p in ps]) for ps in parts)
        ggu, gd = (torch.stack([p[2].expand(r) for p in ps]).contiguous() for ps, r in zip(parts, (2 * i, h)))
        scales = MoeScales(sgu[:, :i], sgu[:, i:], sd, ggu[:, :i], ggu[:, i:], gd)
    ids = torch.randint(0, e, (batch, 4), device="cuda", generator=g, dtype=torch.int32)
    x = torch.randn(batch, h, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.rand(batch, 4, device="cuda", generator=g) + 0.1
    dq = scales.dequantized(qgu[:, :i], qgu[:, i:], qd, torch.float32)
    want = fused_moe_ref(x.float(), *dq, ids, w)
    for tiles in (None, moe_tiles(batch * 4, e, i, h)):  # the new kernels, then the first ones
        got = fused_moe(x, qgu[:, :i], qgu[:, i:], qd, ids, w, backend=T, scales=scales, tiles=tiles)
        assert _rel(got, want) < 3e-2, tiles
