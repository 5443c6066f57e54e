"""The routed experts at one token as GEMVs (kernels/moe_gemv.py, interpreter) against the fp64 reference."""

from dataclasses import replace

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime import quant
from m3bench.runtime.kernels import moe, moe_gemv_triton, moe_triton
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import (
    MoeActivation,
    MoeScales,
    MoeTiles,
    fused_moe,
    gemv_tiles,
)
from m3bench.runtime.kernels.moe_sum import MoeSum
from m3bench.runtime.kernels.mx_linear import split_counters
from m3bench.runtime.kernels.reference import fused_moe_ref

from .quant_cases import mx_random

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON
N_EXP, HIDDEN, INTER = 6, 256, 160  # 160 inputs of the down GEMM: K chunks of 64 end in a shorter one


def _experts(seed: int, mxfp8: bool, block_major: bool = False):
    """(w_gate, w_up, w_down, scales, fp64 gate, up, down): views into one stacked gate|up, as the layer keeps them."""
    g = torch.Generator().manual_seed(seed)
    if not mxfp8:
        gu, d = torch.randn(N_EXP, 2 * INTER, HIDDEN, generator=g) * 0.3, torch.randn(N_EXP, HIDDEN, INTER, generator=g)
        d = d * 0.2
        return gu[:, :INTER], gu[:, INTER:], d, None, gu[:, :INTER].double(), gu[:, INTER:].double(), d.double()
    (wgu, sgu), (wd, sd) = mx_random(g, N_EXP, 2 * INTER, HIDDEN), mx_random(g, N_EXP, HIDDEN, INTER)
    dgu, dd = quant.dequant_mxfp8(wgu, sgu, torch.float64), quant.dequant_mxfp8(wd, sd, torch.float64)
    if block_major:
        wgu, wd = quant.block_major(wgu), quant.block_major(wd)
    scales = MoeScales(sgu[:, :INTER], sgu[:, INTER:], sd)
    return wgu[:, :INTER], wgu[:, INTER:], wd, scales, dgu[:, :INTER], dgu[:, INTER:], dd


def _token(seed: int, local: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[4, 1, 5, -1][:local] + [-1, 7, -3, 9][local:]], dtype=torch.int32)  # the rest: other ranks'
    return torch.randn(1, HIDDEN, generator=g).to(dtype) * 2, ids, torch.rand(1, 4, generator=g) + 0.1


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> bool:
    """Within rel of the largest |want| (fp32 sums of products up to ~1e3 against fp64), all finite."""
    return bool(torch.isfinite(got).all()) and float((got.double() - want).abs().max()) <= rel * float(
        want.abs().max().clamp(min=1.0))


def _tiles(split_k: int = 2, split_down: int = 3, block_k: int = 64) -> MoeTiles:
    return MoeTiles(16, 16, block_k, num_warps=4, num_stages=1, block_n_down=16, split_k=split_k,
                    split_k_routed=split_k, split_down=split_down, gemv=True)


@pytest.mark.parametrize("act", [MoeActivation.SWIGLUOAI, MoeActivation.SILU])
@pytest.mark.parametrize(("mxfp8", "block_major"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("local", [0, 1, 3])
def test_gemv_moe_matches_the_fp64_reference(mxfp8, block_major, local, act):
    """Plain and MXFP8 (row- and block-major) experts, 0-3 of the four picks local: gate|up K in 2 pieces (the last
    one activates), the down GEMM's 160 inputs in 3 chunks (64, 64, 32); the fp64 reference of the same weights."""
    wg, wu, wd, scales, dg, du, dd = _experts(10 + local, mxfp8, block_major)
    x, ids, w = _token(20 + local, local)
    out = torch.full_like(x, float("nan"))
    fused_moe(x, wg, wu, wd, ids, w, act, out=out, backend=T, tiles=_tiles(), scales=scales)
    want = fused_moe_ref(x.double(), dg, du, dd, ids, w.double(), act)
    assert _close(out, want)
    if not local:
        assert not out.any()


@pytest.mark.parametrize(("split_k", "split_down"), [(1, 1), (4, 2), (2, 5)])
def test_gemv_splits_give_the_unsplit_sums_and_leave_counters_zero(split_k, split_down):
    """Any K pieces of gate|up (1: no partials) and chunks of down (5 asked of 160 inputs in steps of 64: 3): within
    fp32 rounding of one piece, the fp64 reference, the split counters zero after, the same bits a second time."""
    wg, wu, wd, scales, dg, du, dd = _experts(30, True, True)
    x, ids, w = _token(31, 2)
    got = fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=_tiles(split_k, split_down), scales=scales)
    assert not split_counters(x.device).any()
    assert torch.equal(fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=_tiles(split_k, split_down), scales=scales),
                       got)
    one = fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=_tiles(1, 1), scales=scales)
    assert _close(got, one.double(), 1e-6)
    assert _close(got, fused_moe_ref(x.double(), dg, du, dd, ids, w.double()))


def test_gemv_moe_is_three_launches_without_alignment(monkeypatch):
    """gate|up, down (chunks on the grid's second axis) and the sum; no alignment; bf16 activations round once, at
    the sum, as the first generation's do."""
    launches = recorded_launches(monkeypatch, (moe_triton, moe_gemv_triton), grids=True)
    wg, wu, wd, scales, dg, du, dd = _experts(40, True, True)
    x, ids, w = _token(41, 2, torch.bfloat16)
    got = fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=_tiles(2, 3), scales=scales)
    assert [n for n, _ in launches] == ["moe_gemv_gate_up_kernel", "moe_gemv_down_kernel", "moe_sum_kernel"]
    assert launches[0][1] == (4 * INTER // 16, 2) and launches[1][1] == (4 * HIDDEN // 16, 3)
    want = fused_moe_ref(x.double(), dg, du, dd, ids, w.double())
    assert got.dtype == torch.bfloat16 and _close(got, want, 8e-3)


def test_gemv_partials_deferred_and_added(monkeypatch):
    """defer_sum returns the down GEMM's planes unsummed (MoeSum, the chunks on its first axis); an add joins the sum."""
    wg, wu, wd, _, dg, du, dd = _experts(50, False)
    x, ids, w = _token(51, 1)
    add = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(52))
    part = fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=_tiles(2, 3), defer_sum=True, add=add)
    assert isinstance(part, MoeSum) and part.y.shape == (3, 4, HIDDEN)
    want = fused_moe_ref(x.double(), dg, du, dd, ids, w.double()) + add.double()
    assert _close(part.summed(), want)


def test_gemv_refuses_what_it_cannot_run():
    wg, wu, wd, scales, *_ = _experts(60, True)
    x, ids, w = _token(61, 1)
    tiles = _tiles()
    two = torch.cat([x, x]), torch.cat([ids, ids]), torch.cat([w, w])
    with pytest.raises(ValueError, match="takes one token"):
        fused_moe(two[0], wg, wu, wd, two[1], two[2], backend=T, tiles=tiles, scales=scales)
    with pytest.raises(ValueError, match="does not divide the hidden size"):
        fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=replace(tiles, split_k=3), scales=scales)
    nv = MoeScales(scales.gate, scales.up, scales.down, torch.ones(N_EXP, INTER), torch.ones(N_EXP, INTER),
                   torch.ones(N_EXP, HIDDEN))
    with pytest.raises(ValueError, match="not NVFP4"):
        fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=tiles, scales=nv)
    strided = wd.float().transpose(1, 2).contiguous().transpose(1, 2)  # the same values, inputs not contiguous
    with pytest.raises(ValueError, match="contiguous along their last"):
        fused_moe(x, wg.float(), wu.float(), strided, ids, w, backend=T, tiles=tiles)
    shared = moe.SharedExpert(wg[0].float(), wu[0].float(), wd[0].float())
    with pytest.raises(ValueError, match="GEMVs run routed experts alone"):
        fused_moe(x, wg.float(), wu.float(), wd.float(), ids, w, backend=T, tiles=tiles, shared=shared)


def test_gemv_tiles_fill_a_wave_at_one_pick_and_the_switch_picks_them(monkeypatch):
    """At a TP8/EP8 rank's shapes one local pick's GEMV programs fit a wave of resident ones (gate|up 3 an SM, down 4, x
    132) with two K steps or more each; first_generation_tiles gives them at one token for the formats in ROUTED_GEMV_FMTS only
    (MXFP8 by default), never with the shared expert inside or at two tokens."""
    t = gemv_tiles(3072, 6144)
    assert (t.block_n, t.block_k, t.n_down, t.num_warps, t.num_stages, t.gemv) == (16, 512, 16, 8, 1, True)
    assert (t.split_k, t.split_down) == (2, 1)  # gate|up 192 tiles x 2 <= 396, down 384 <= 528; 6 steps of 512 each
    tiles = lambda n_tok, fmt, shared=0: moe.first_generation_tiles(n_tok, 4, 16, 3072, 6144, fmt > 0,
                                                                    shared, fmt)
    assert moe.ROUTED_GEMV_FMTS == frozenset({1})
    monkeypatch.setattr(moe, "ROUTED_GEMV_FMTS", frozenset())
    assert not tiles(1, 0).gemv and not tiles(1, 1).gemv
    monkeypatch.setattr(moe, "ROUTED_GEMV_FMTS", frozenset({1}))
    assert tiles(1, 1) == t and not tiles(1, 0).gemv and not tiles(2, 1).gemv and not tiles(1, 3).gemv
    assert not tiles(1, 1, shared=384).gemv
