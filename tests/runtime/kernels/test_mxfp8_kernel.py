"""MXFP8 GEMM and MXFP8 fused MoE (Triton interpreter) against dequantize-then-matmul in fp32."""

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, MoeTiles, fused_moe
from m3bench.runtime.kernels.mxfp8 import LinearTiles, mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON


def _mx(g, *shape):
    """Random MXFP8 weights with scales spread over several exponents."""
    w = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-3, 3, (*shape[:-1], 1), generator=g).float())
    return quant.quant_mxfp8(w)


@pytest.mark.parametrize("m, n, k, tiles", [(1, 48, 64, LinearTiles(16, 16, 32)), (5, 40, 96, LinearTiles(16, 32, 64)),
                                             (33, 24, 128, None)])
@pytest.mark.parametrize("bias", [False, True])
def test_mxfp8_linear_matches_dequantized_fp32(m, n, k, tiles, bias):
    g = torch.Generator().manual_seed(m * 100 + n + bias)
    w, s = _mx(g, n, k)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    want = torch.nn.functional.linear(x.double(), quant.dequant_mxfp8(w, s, torch.float64),
                                      None if b is None else b.double())
    got = mxfp8_linear(x, w, s, b, backend=T, tiles=tiles)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
    torch_path = mxfp8_linear(x, w, s, b, backend=KernelBackend.TORCH)
    assert torch.allclose(torch_path.double(), want, atol=1e-4, rtol=1e-4)


def test_mxfp8_linear_keeps_leading_dims_and_reads_the_scales():
    g = torch.Generator().manual_seed(3)
    w, s = _mx(g, 32, 64)
    x = torch.randn(2, 3, 64, generator=g)
    y = mxfp8_linear(x, w, s, backend=T)
    assert y.shape == (2, 3, 32)
    s2 = s.clone()
    s2[5, 1] += 1  # one block of one row twice as large: only output column 5 changes
    y2 = mxfp8_linear(x, w, s2, backend=T)
    changed = (y2 - y).abs().amax(dim=(0, 1)) > 0
    assert changed.tolist() == [i == 5 for i in range(32)]


@pytest.mark.parametrize("tiles", [MoeTiles(16, 16, 32), MoeTiles(16, 32, 64, block_n_down=16)])
def test_mxfp8_fused_moe_matches_dequantized_fp32(tiles):
    g = torch.Generator().manual_seed(7)
    n_tok, top_k, n_exp, hidden, inter = 6, 2, 4, 64, 96
    (wgu, sgu), (wd, sd) = _mx(g, n_exp, 2 * inter, hidden), _mx(g, n_exp, hidden, inter)
    ids = torch.randint(-1, n_exp + 1, (n_tok, top_k), generator=g, dtype=torch.int32)
    ids[0] = torch.arange(top_k)
    x, w = torch.randn(n_tok, hidden, generator=g) * 2, torch.rand(n_tok, top_k, generator=g) + 0.1
    scales = MoeScales(sgu[:, :inter], sgu[:, inter:], sd)  # views into the stacked gate|up, as the layer keeps them
    got = fused_moe(x, wgu[:, :inter], wgu[:, inter:], wd, ids, w, backend=T, tiles=tiles, scales=scales)
    dq = lambda a, s: quant.dequant_mxfp8(a, s, torch.float64)  # noqa: E731
    want = fused_moe_ref(x.double(), dq(wgu, sgu)[:, :inter], dq(wgu, sgu)[:, inter:], dq(wd, sd), ids, w.double())
    assert torch.allclose(got.double(), want, atol=1e-3, rtol=1e-4)
    torch_path = fused_moe(x, wgu[:, :inter], wgu[:, inter:], wd, ids, w, backend=KernelBackend.TORCH, scales=scales)
    assert torch.allclose(torch_path.double(), want, atol=1e-3, rtol=1e-4)
