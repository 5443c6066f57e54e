"""The q|k|v GEMM that takes the residual add + RMSNorm before it (kernels/norm_linear.py, Triton interpreter)
against fp64 on fresh random inputs: h = residual + delta as the stream's add stores it, y = norm(h) W^T (+ b),
plain and Gemma norms, 1-4 rows, split K (its partial sums of squares meeting in the last split), ragged N; the split
counters left zero, the same bits twice, the unsplit result within fp32 rounding; bf16 within the unfused path's
error; refusals."""

import pytest
import torch

from m3bench.runtime.kernels.add_norm import add_rms_norm_fused
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles, split_counters
from m3bench.runtime.kernels.norm_linear import norm_linear, norm_linear_reference, norm_linear_supported
from m3bench.runtime.kernels.skinny import skinny_linear

pytestmark = pytest.mark.usefixtures("triton_interpreter")
DOT = MxKernel.DOT


def _inputs(m, n, k, dtype=torch.float32, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    r = (torch.randn(m, k, generator=g) * 3).to(dtype)
    d = torch.randn(m, k, generator=g).to(dtype)
    nw = (torch.randn(k, generator=g) * 0.3).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return r, d, nw, w, b


@pytest.mark.parametrize("m, n, k, tiles", [
    (1, 40, 96, MxTiles(DOT, 16, 32, 32, split_k=3)),    # ragged N, three K pieces
    (3, 64, 256, MxTiles(DOT, 16, 32, 64, split_k=2)),   # EVEN: no masks
    (4, 24, 512, MxTiles(DOT, 16, 16, 64, split_k=8)),
    (2, 48, 128, MxTiles(DOT, 16, 64, 32, split_k=1)),   # whole K: the row's sum of squares in one program
    (1, 24, 512, None),                                  # the rule's tiles
])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_norm_linear_matches_fp64(m, n, k, tiles, gemma, bias):
    r, d, nw, w, b = _inputs(m, n, k, seed=m * 100 + n + k + 7 * gemma + bias, bias=bias)
    h_out = torch.full_like(r, float("nan"))
    h, y = norm_linear(r, d, nw, 1e-6, gemma, w, b, h_out=h_out, tiles=tiles)
    want_h, want_y = norm_linear_reference(r, d, nw, 1e-6, gemma, w, b)
    assert h.data_ptr() == h_out.data_ptr() and torch.equal(h, want_h)  # every column of every row written
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert torch.allclose(y.double(), want_y, atol=1e-5, rtol=1e-5)


def test_split_counters_left_zero_same_bits_and_the_unsplit_result():
    r, d, nw, w, _ = _inputs(2, 32, 512, seed=3)
    split = MxTiles(DOT, 16, 16, 64, split_k=4)
    first = norm_linear(r, d, nw, 1e-5, True, w, tiles=split)[1]
    assert not split_counters(r.device).any()
    assert torch.equal(norm_linear(r, d, nw, 1e-5, True, w, tiles=split)[1], first)
    whole = norm_linear(r, d, nw, 1e-5, True, w, tiles=MxTiles(DOT, 16, 16, 64, split_k=1))[1]
    assert torch.allclose(first, whole, atol=1e-5, rtol=1e-5)


def test_the_scale_is_the_whole_rows():
    """Each row's norm over all K (not one split's chunk, not another row's): rows of very different sizes, K split."""
    r, d, nw, w, _ = _inputs(3, 32, 256, seed=11)
    r[0] *= 100.0
    r[2, :64] *= 50.0  # one split's chunk of one row far larger than the rest
    got = norm_linear(r, d, nw, 1e-6, False, w, tiles=MxTiles(DOT, 16, 32, 64, split_k=4))[1]
    assert torch.allclose(got.double(), norm_linear_reference(r, d, nw, 1e-6, False, w)[1], atol=1e-5, rtol=1e-5)


def test_bf16_within_the_unfused_paths_error():
    """bf16: h as the add + norm kernel stores it (bit for bit), y as close to fp64 as the add + norm then the skinny
    GEMM (the operand rounded at another scale: the same rounding)."""
    r, d, nw, w, b = _inputs(2, 64, 512, torch.bfloat16, seed=5, bias=True)
    tiles = MxTiles(DOT, 16, 32, 64, split_k=4)
    h, y = norm_linear(r, d, nw, 1e-6, True, w, b, tiles=tiles)
    h_apart, x = add_rms_norm_fused(r, d, nw, 1e-6, True)
    y_apart = skinny_linear(x, w, b, tiles=tiles)
    want = norm_linear_reference(r, d, nw, 1e-6, True, w, b)[1]
    assert torch.equal(h, h_apart) and y.dtype == torch.bfloat16
    err, err_apart = ((t.double() - want).abs().max().item() for t in (y, y_apart))
    assert err <= 2 * err_apart + 1e-3 * want.abs().max().item()


def test_refusals():
    r, d, nw, w, _ = _inputs(2, 32, 128, seed=1)
    assert norm_linear_supported(r, d, w)
    assert not norm_linear_supported(r.half(), d.half(), w.half())  # fp16: h * w_norm may overflow
    assert not norm_linear_supported(torch.zeros(17, 128), torch.zeros(17, 128), w)  # past the skinny rows
    assert not norm_linear_supported(r, d[:1], w)
    assert not norm_linear_supported(r, d, w[:, :64])
    assert not norm_linear_supported(r, d, w, max_rows=1)
    with pytest.raises(ValueError, match="norm_linear needs"):
        norm_linear(r, d[:1], nw, 1e-6, False, w)
    with pytest.raises(ValueError, match="h_out"):
        norm_linear(r, d, nw, 1e-6, False, w, h_out=torch.empty(2, 64))
    with pytest.raises(ValueError, match="dot kernel"):
        norm_linear(r, d, nw, 1e-6, False, w, tiles=MxTiles(MxKernel.GEMV, 2, 16, 64))
