"""The tile-dequantizing MXFP8 / NVFP4 decode kernels (Triton interpreter) against dequantize-then-matmul in
fp64, on fresh random inputs: the GEMV and dot linear kernels with split K, and the quantized fused MoE."""

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.errors import InputError
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, fused_moe
from m3bench.runtime.kernels.moe_quant import QuantMoeTiles, quant_moe_tiles
from m3bench.runtime.kernels.mx_linear import PER_SM, MxKernel, MxTiles, mx_tiles, split_counters
from m3bench.runtime.kernels.mxfp8 import linear_tiles, mxfp8_linear
from m3bench.runtime.kernels.quant_kernels import ENV_VAR, QuantKernels, default_quant_kernels
from m3bench.runtime.kernels.reference import fused_moe_ref

from .quant_cases import mx_random, nv_random_experts

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON
GEMV, DOT = MxKernel.GEMV, MxKernel.DOT


@pytest.fixture(autouse=True)
def v2_by_default(monkeypatch):
    """Calls without tiles run these kernels' own tile choice (pinned to V2: AUTO picks per call)."""
    _set_generation(monkeypatch, "v2")
    yield
    default_quant_kernels.cache_clear()  # the next module reads the environment as it is


def _set_generation(monkeypatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(ENV_VAR)
    else:
        monkeypatch.setenv(ENV_VAR, value)
    default_quant_kernels.cache_clear()  # read once a process: a new value needs a fresh read


def test_default_generation_is_the_measured_choice_unless_pinned(monkeypatch):
    """No tiles: AUTO by default (the H200's faster generation per call), V1 / V2 when pinned, a bad value
    refused; V1's and V2's results both match fp64."""
    from m3bench.runtime.kernels.quant_kernels import LINEAR_V2_FROM_ROWS, linear_generation, moe_generation

    g = torch.Generator().manual_seed(11)
    w, s = _mx(g, 24, 128)
    x = torch.randn(3, 128, generator=g)
    runs = {}
    for gen in ("v1", "v2"):
        _set_generation(monkeypatch, gen)
        assert default_quant_kernels() is QuantKernels(gen)
        assert {linear_generation(r) for r in (1, 3, 64)} == {moe_generation(True), moe_generation(False)} == {
            QuantKernels(gen)}
        runs[gen] = mxfp8_linear(x, w, s, backend=T)
        assert torch.allclose(runs[gen].double(), _want(x, w, s), atol=1e-4, rtol=1e-4)
    assert torch.equal(runs["v1"], mxfp8_linear(x, w, s, backend=T, tiles=linear_tiles(3, 24, 128)))
    assert torch.equal(runs["v2"], mxfp8_linear(x, w, s, backend=T, tiles=mx_tiles(3, 24, 128)))
    _set_generation(monkeypatch, None)
    assert default_quant_kernels() is QuantKernels.AUTO
    assert linear_generation(1) is QuantKernels.V2 and mx_tiles(1, 24, 128).kernel is GEMV  # the GEMV at one row
    assert linear_generation(16) is linear_generation(64) is linear_generation(LINEAR_V2_FROM_ROWS - 1) is QuantKernels.V1
    assert linear_generation(LINEAR_V2_FROM_ROWS) is linear_generation(128) is QuantKernels.V2
    assert moe_generation(nvfp4=False) is QuantKernels.V1 and moe_generation(nvfp4=True) is QuantKernels.V2
    assert torch.equal(mxfp8_linear(x, w, s, backend=T), runs["v1"])  # 3 rows: V1
    _set_generation(monkeypatch, "v3")
    with pytest.raises(InputError, match="M3BENCH_QUANT_KERNELS='v3'"):
        default_quant_kernels()


def _mx(g, *shape):
    return mx_random(g, *shape, spread=4)


def _want(x, w, s, b=None):
    return torch.nn.functional.linear(x.double(), quant.dequant_mxfp8(w, s, torch.float64),
                                      None if b is None else b.double())


@pytest.mark.parametrize("m, n, k, tiles", [
    (1, 48, 64, MxTiles(GEMV, 1, 16, 64)),
    (2, 40, 256, MxTiles(GEMV, 2, 16, 64, split_k=2)),   # ragged N, two K pieces
    (3, 24, 384, MxTiles(GEMV, 4, 16, 128, split_k=3)),  # 3 of 4 rows live, 3 pieces
    (5, 40, 96, MxTiles(DOT, 16, 32, 32, split_k=3)),
    (33, 24, 128, MxTiles(DOT, 32, 16, 32, split_k=4)),  # two M tiles
    (1, 24, 512, None), (3, 24, 512, None), (17, 64, 256, None), (70, 16, 64, None),  # 70 rows: BLOCK_M 128
])
@pytest.mark.parametrize("bias", [False, True])
def test_decode_linear_matches_dequantized_fp64(m, n, k, tiles, bias):
    g = torch.Generator().manual_seed(m * 100 + n + k + bias)
    w, s = _mx(g, n, k)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = mxfp8_linear(x, w, s, b, backend=T, tiles=tiles)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), _want(x, w, s, b), atol=1e-4, rtol=1e-4)


def test_split_k_counters_are_left_zero_and_results_repeat():
    """The last split of a tile resets its counter: a second launch sums the same way (deterministic)."""
    g = torch.Generator().manual_seed(5)
    w, s = _mx(g, 32, 512)
    x = torch.randn(2, 512, generator=g)
    for tiles in (MxTiles(GEMV, 2, 16, 64, split_k=8), MxTiles(DOT, 16, 16, 64, split_k=4)):
        first = mxfp8_linear(x, w, s, backend=T, tiles=tiles)
        assert not split_counters(x.device).any()
        assert torch.equal(mxfp8_linear(x, w, s, backend=T, tiles=tiles), first)
        assert torch.allclose(first.double(), _want(x, w, s), atol=1e-4, rtol=1e-4)


def test_decode_linear_reads_each_block_scale():
    """One E8M0 block of one row doubled: only that output column changes, by that block's share."""
    g = torch.Generator().manual_seed(3)
    w, s = _mx(g, 32, 128)
    x = torch.randn(1, 128, generator=g)
    for tiles in (MxTiles(GEMV, 1, 16, 64, split_k=2), MxTiles(DOT, 16, 16, 64, split_k=2)):
        y = mxfp8_linear(x, w, s, backend=T, tiles=tiles)
        s2 = s.clone()
        s2[5, 3] += 1
        y2 = mxfp8_linear(x, w, s2, backend=T, tiles=tiles)
        block = (x[0, 96:].double() * quant.dequant_mxfp8(w, s, torch.float64)[5, 96:]).sum()
        assert torch.allclose((y2 - y)[0, 5].double(), block, atol=1e-4)
        assert ((y2 - y).abs()[0] > 0).tolist() == [i == 5 for i in range(32)]


def test_decode_tiles_split_k_within_one_wave_at_rank_shapes():
    assert mx_tiles(1, 1536, 6144).kernel is GEMV and mx_tiles(2, 1536, 6144).kernel is DOT  # one row: the GEMV
    t = mx_tiles(1, 1536, 6144, DOT)  # qkv + index of a TP8 rank at batch 1: 24 tiles x 12 pieces of two K steps
    assert (t.kernel, t.block_m, t.block_n, t.block_k, t.split_k) == (DOT, 16, 64, 256, 12)
    t32, t64 = mx_tiles(32, 1536, 6144), mx_tiles(64, 1536, 6144)  # 2 / 3 programs an SM: 8 / 16 pieces
    assert (t32.block_m, t32.block_k, t32.split_k, t64.block_m, t64.block_k, t64.split_k) == (32, 256, 8, 64, 128, 16)
    assert mx_tiles(8192, 1536, 6144).block_m == 128 and mx_tiles(8192, 1536, 6144).split_k == 1  # prefill
    g = mx_tiles(1, 1536, 6144, MxKernel.GEMV)  # the GEMV: 96 tiles x 6 pieces of two 512-steps
    assert (g.block_n, g.block_k, g.split_k, g.num_warps) == (16, 512, 6, 8)
    assert mx_tiles(1, 3072, 6144, MxKernel.GEMV).split_k == 4  # 192 x 6 would exceed a wave of 6 an SM
    assert mx_tiles(1, 6144, 1024, MxKernel.GEMV).split_k == 1  # o_proj: two K steps, not split to one a piece
    t = mx_tiles(64, 6144, 384)  # shared expert down at batch 64: BLOCK_K 128 divides 384
    assert t.block_k == 128 and 384 % (t.split_k * t.block_k) == 0
    for m, n, k in ((1, 1536, 6144), (2, 6144, 1536), (16, 768, 6144), (64, 6144, 1024)):
        t = mx_tiles(m, n, k)  # one wave: resident programs an SM (the GEMV's 6, the dot's 2-3) x 132 SMs
        cap = PER_SM["gemv" if t.kernel is GEMV else t.block_m] * 132
        assert t.grid(m, n)[0] * t.split_k <= cap and k % (t.split_k * t.block_k) == 0


def test_gemv_refuses_more_rows_than_its_block():
    g = torch.Generator().manual_seed(1)
    w, s = _mx(g, 16, 64)
    with pytest.raises(ValueError, match="at most block_m"):
        mxfp8_linear(torch.randn(3, 64), w, s, backend=T, tiles=MxTiles(GEMV, 2, 16, 64))


def _routing(g, n_tok, top_k, n_exp):
    ids = torch.randint(-1, n_exp + 1, (n_tok, top_k), generator=g, dtype=torch.int32)  # -1 / n_exp: not local
    ids[0] = torch.arange(top_k)
    return ids, torch.rand(n_tok, top_k, generator=g) + 0.1


@pytest.mark.parametrize("tiles", [None, QuantMoeTiles(16, 32, 32), QuantMoeTiles(32, 16, 64),
                                   QuantMoeTiles(16, 32, 32, split_k=2)])
def test_quant_moe_mxfp8_matches_dequantized_fp64(tiles):
    g = torch.Generator().manual_seed(11)
    n_tok, top_k, n_exp, hidden, inter = 7, 2, 4, 64, 96
    (wgu, sgu), (wd, sd) = _mx(g, n_exp, 2 * inter, hidden), _mx(g, n_exp, hidden, inter)
    ids, w = _routing(g, n_tok, top_k, n_exp)
    x = torch.randn(n_tok, hidden, generator=g)
    scales = MoeScales(sgu[:, :inter], sgu[:, inter:], sd)  # views into the stacked gate|up, as the layer keeps them
    got = fused_moe(x, wgu[:, :inter], wgu[:, inter:], wd, ids, w, backend=T, tiles=tiles, scales=scales)
    dgu, dd = quant.dequant_mxfp8(wgu, sgu, torch.float64), quant.dequant_mxfp8(wd, sd, torch.float64)
    want = fused_moe_ref(x.double(), dgu[:, :inter], dgu[:, inter:], dd, ids, w.double())
    assert torch.allclose(got.double(), want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
    assert not split_counters(x.device).any()  # split gate|up pieces reset their counters


@pytest.mark.parametrize("tiles", [None, QuantMoeTiles(16, 32, 32), QuantMoeTiles(16, 16, 32, split_k=2)])
def test_quant_moe_nvfp4_matches_dequantized_fp64(tiles):
    g = torch.Generator().manual_seed(12)
    n_tok, top_k, n_exp, hidden, inter = 6, 2, 4, 64, 96
    (pgu, sgu, ggu), (pd, sd, gd) = nv_random_experts(g, n_exp, 2 * inter, hidden), nv_random_experts(g, n_exp, hidden, inter)
    ids, w = _routing(g, n_tok, top_k, n_exp)
    x, i = torch.randn(n_tok, hidden, generator=g), inter
    scales = MoeScales(sgu[:, :i], sgu[:, i:], sd, ggu[:, :i], ggu[:, i:], gd)
    got = fused_moe(x, pgu[:, :i], pgu[:, i:], pd, ids, w, backend=T, tiles=tiles, scales=scales)
    dgu, dd = quant.dequant_nvfp4(pgu, sgu, ggu, torch.float64), quant.dequant_nvfp4(pd, sd, gd, torch.float64)
    want = fused_moe_ref(x.double(), dgu[:, :i], dgu[:, i:], dd, ids, w.double())
    assert torch.allclose(got.double(), want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)


def test_quant_moe_tiles_grow_with_pairs_per_expert():
    t1 = quant_moe_tiles(4, 16, 3072, 6144)  # decode batch 1: four pairs, 4 x 48 gate|up tiles: K in two
    assert (t1.block_m, t1.split_k) == (16, 2)
    t64 = quant_moe_tiles(64 * 4, 16, 3072, 6144)
    assert (t64.block_m, t64.split_k) == (32, 1) and quant_moe_tiles(4096, 16, 3072, 6144).block_m == 64
    assert quant_moe_tiles(16, 16, 3072, 6144).split_k == 1  # 16 x 48 tiles already fill the wave
