"""MXFP8 / NVFP4 kernels on the GPU at one TP8 rank's real shapes, against dequantize-then-matmul in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, fused_moe
from m3bench.runtime.kernels.mxfp8 import mxfp8_linear
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


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("batch", [1, 64])
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
    got = fused_moe(x, qgu[:, :i], qgu[:, i:], qd, ids, w, backend=T, scales=scales)
    dq = scales.dequantized(qgu[:, :i], qgu[:, i:], qd, torch.float32)
    want = fused_moe_ref(x.float(), *dq, ids, w)
    assert _rel(got, want) < 3e-2
