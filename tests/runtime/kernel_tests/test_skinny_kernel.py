"""The few-row decode GEMMs over plain weights (Triton interpreter) against fp64 matmul on fresh random
inputs: both kernels, split K, ragged N, bias, add, the gated epilogue, 1-4 rows; the tile rule at a TP8
rank's shapes."""

import pytest
import torch

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles, split_counters
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.kernels.skinny import PER_SM, Gate, skinny_linear, skinny_supported, skinny_tiles
from m3bench.runtime.layers.activation import gated_activation

pytestmark = pytest.mark.usefixtures("triton_interpreter")
GEMV, DOT = MxKernel.GEMV, MxKernel.DOT


def _want(x, w, b=None):
    return torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("m, n, k, tiles", [
    (1, 48, 64, MxTiles(GEMV, 1, 16, 64)),
    (2, 40, 256, MxTiles(GEMV, 2, 16, 64, split_k=2)),   # ragged N, two K pieces
    (3, 24, 384, MxTiles(GEMV, 4, 16, 128, split_k=3)),  # 3 of 4 rows live, 3 pieces
    (1, 40, 96, MxTiles(DOT, 16, 32, 32, split_k=3)),
    (4, 64, 256, MxTiles(DOT, 16, 32, 64, split_k=2)),   # EVEN: no masks
    (4, 24, 512, None), (1, 24, 512, None),
])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_matches_fp64(m, n, k, tiles, bias):
    g = torch.Generator().manual_seed(m * 100 + n + k + bias)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = skinny_linear(x, w, b, tiles=tiles)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert torch.allclose(got.double(), _want(x, w, b), atol=1e-4, rtol=1e-4)


def test_skinny_linear_bf16_within_bf16_rounding():
    """bf16 in and out: fp32 accumulation, one rounding of the output."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(64, 256, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(2, 3, 256, generator=g).to(torch.bfloat16)[:, :1]  # [2, 1, K]: a leading shape kept
    for kernel in (GEMV, DOT):
        got = skinny_linear(x, w, tiles=skinny_tiles(2, 64, 256, torch.bfloat16, kernel))
        want = _want(x, w)
        assert got.shape == (2, 1, 64) and got.dtype == torch.bfloat16
        assert (got.double() - want).abs().max() <= 8e-3 * want.abs().max()


def test_split_k_counters_are_left_zero_and_results_repeat():
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(32, 512, generator=g), torch.randn(2, 512, generator=g)
    for tiles in (MxTiles(GEMV, 2, 16, 64, split_k=8), MxTiles(DOT, 16, 16, 64, split_k=4)):
        first = skinny_linear(x, w, tiles=tiles)
        assert not split_counters(x.device).any()
        assert torch.equal(skinny_linear(x, w, tiles=tiles), first)
        assert torch.allclose(first.double(), _want(x, w), atol=1e-4, rtol=1e-4)


def test_each_weight_reaches_its_output():
    """One weight changed: only its output column moves, by its input times the change."""
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(32, 256, generator=g), torch.randn(1, 256, generator=g)
    for tiles in (MxTiles(GEMV, 1, 16, 64, split_k=2), MxTiles(DOT, 16, 16, 64, split_k=2)):
        y = skinny_linear(x, w, tiles=tiles)
        w2 = w.clone()
        w2[5, 200] += 1.0
        d = skinny_linear(x, w2, tiles=tiles) - y
        assert torch.allclose(d[0, 5], x[0, 200], atol=1e-4)
        assert ((d.abs()[0] > 0).tolist()) == [i == 5 for i in range(32)]


def test_refuses_more_rows_than_its_block_and_a_k_it_cannot_split():
    w = torch.randn(16, 64)
    with pytest.raises(ValueError, match="at most block_m"):
        skinny_linear(torch.randn(3, 64), w, tiles=MxTiles(GEMV, 2, 16, 64))
    with pytest.raises(ValueError, match="does not divide K"):
        skinny_linear(torch.randn(1, 64), w, tiles=MxTiles(DOT, 16, 16, 64, split_k=2))


def test_supported_only_for_few_rows_of_one_plain_dtype():
    w = torch.randn(16, 64)
    assert skinny_supported(torch.randn(4, 64), w) and skinny_supported(torch.randn(1, 1, 64), w)
    assert skinny_supported(torch.randn(16, 64).half(), w.half()) and not skinny_supported(torch.randn(17, 64), w)
    assert not skinny_supported(torch.randn(5, 64), w)  # fp32 (the GEMV) to 4 rows
    assert not skinny_supported(torch.randn(0, 64), w)
    assert not skinny_supported(torch.randn(1, 64).double(), w.double())
    assert not skinny_supported(torch.randn(1, 64).to(torch.bfloat16), w)  # mixed dtypes
    assert not skinny_supported(torch.randn(1, 48), torch.randn(16, 48))  # K not a multiple of 32
    assert not skinny_supported(torch.randn(1, 64), torch.randn(64, 16).t())  # not contiguous along K


def test_tiles_at_rank_shapes_follow_the_h200_sweep():
    """One TP8 rank's GEMMs at 1 row: K split as the sweeps found fastest (qkv + index and dense gate|up 4
    pieces of 12 steps, o_proj and the down GEMMs whole, the shared gate|up 8: 4 would leave SMs idle), never past
    1.5 programs an SM."""
    splits = {(n, k): skinny_tiles(1, n, k).split_k for n, k in ((1920, 6144), (6144, 1024), (3072, 6144),
                                                                  (6144, 1536), (768, 6144), (6144, 384))}
    assert splits == {(1920, 6144): 4, (6144, 1024): 1, (3072, 6144): 4, (6144, 1536): 1, (768, 6144): 8,
                      (6144, 384): 1}
    for (n, k), split in splits.items():
        t = skinny_tiles(1, n, k)
        assert t.kernel is DOT and k % (split * t.block_k) == 0 and t.grid(1, n)[0] * split <= PER_SM[DOT] * 132
    assert skinny_tiles(1, 6144, 384).block_k == 64  # K 384: six steps of 64
    gated = skinny_tiles(1, 384, 6144, gated=True)  # shared gate|up with its activation: half the columns
    assert (gated.kernel, gated.block_n, gated.split_k) == (DOT, 32, 8)
    assert skinny_tiles(1, 1536, 6144, gated=True).split_k == 4  # dense gate|up + act: 48 tiles of 32
    assert skinny_tiles(1, 128, 6144, torch.float32).kernel is GEMV  # the fp32 router
    assert skinny_tiles(1, 128, 6144, torch.float32, gated=True).kernel is DOT


@pytest.mark.parametrize("activation", list(MoeActivation))
@pytest.mark.parametrize("m, tiles", [(1, None), (3, MxTiles(DOT, 16, 16, 64, split_k=2)),
                                      (2, MxTiles(DOT, 16, 32, 32, split_k=1))])
def test_gated_matches_gemm_then_activation(activation, m, tiles):
    """act(x W_gate^T, x W_up^T) from one fused gate|up weight [2I, K] (ragged I = 40), split or not."""
    g = torch.Generator().manual_seed(m + 3)
    inter, k = 40, 256
    w = torch.randn(2 * inter, k, generator=g) * 0.1
    x = torch.randn(m, k, generator=g)
    gate = Gate(activation, 1.702, 7.0)
    got = skinny_linear(x, w, tiles=tiles, gate=gate)
    gu = _want(x, w)
    want = gated_activation(Activation(activation.value), gu[:, :inter], gu[:, inter:], 1.702, 7.0)
    assert got.shape == (m, inter) and torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
    assert not split_counters(x.device).any()


def test_add_joins_in_the_epilogue():
    g = torch.Generator().manual_seed(9)
    w, x = torch.randn(40, 128, generator=g), torch.randn(3, 128, generator=g)
    add = torch.randn(3, 80, generator=g)[:, ::2]  # strided rows and columns: copied to rows
    for tiles in (MxTiles(DOT, 16, 16, 64, split_k=2), MxTiles(GEMV, 4, 16, 64)):
        got = skinny_linear(x, w, tiles=tiles, add=add)
        assert torch.allclose(got.double(), _want(x, w) + add.double(), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="a bias or an add"):
        skinny_linear(x, w, torch.zeros(40), add=add)
    with pytest.raises(ValueError, match="gated"):
        skinny_linear(x, w, add=add, gate=Gate(MoeActivation.SILU, 1.0, 0.0))
