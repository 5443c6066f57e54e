"""NVFP4 experts with their codes held as e4m3 bytes (quant.e2m1_as_e4m3; FMT 3 of kernels/moe_triton.py): the
conversion is exact and reversible; the first-generation fused MoE runs them with 16-wide sub-dots (Triton
interpreter) and matches dequantize-then-matmul in fp64, row- and block-major, with and without the router's
alignment; the packed experts' results through the torch path are the same values."""

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, MoeTiles, first_generation, fused_moe
from m3bench.runtime.kernels.reference import fused_moe_ref

from .quant_cases import nv_random_experts

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON


def test_codes_as_e4m3_are_exact_and_reversible():
    g = torch.Generator().manual_seed(3)
    packed, scale, glob = nv_random_experts(g, 2, 8, 64)
    codes = quant.e2m1_as_e4m3(packed)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (2, 8, 64)
    assert torch.equal(codes.float(), quant.unpack_e2m1(packed))  # every code's value, exactly
    assert torch.equal(quant.e4m3_as_e2m1(codes), packed)
    every = torch.arange(256, dtype=torch.uint8).reshape(1, 256)  # all 16 codes in both nibbles
    back = quant.e4m3_as_e2m1(quant.e2m1_as_e4m3(every))
    assert torch.equal(quant.unpack_e2m1(back), quant.unpack_e2m1(every))  # the same values (-0 comes back as 0)
    for held in (codes, quant.block_major(codes, quant.NV_BLOCK)):
        assert torch.equal(quant.dequant_nvfp4(held, scale, glob, torch.float64),
                           quant.dequant_nvfp4(packed, scale, glob, torch.float64))


def _experts(seed: int, n_exp: int = 4, hidden: int = 128, inter: int = 96):
    g = torch.Generator().manual_seed(seed)
    (pgu, sgu, ggu), (pd, sd, gd) = nv_random_experts(g, n_exp, 2 * inter, hidden), nv_random_experts(g, n_exp,
                                                                                                       hidden, inter)
    scales = MoeScales(sgu[:, :inter], sgu[:, inter:], sd, ggu[:, :inter], ggu[:, inter:], gd)
    dgu, dd = quant.dequant_nvfp4(pgu, sgu, ggu, torch.float64), quant.dequant_nvfp4(pd, sd, gd, torch.float64)
    return g, (pgu, pd), scales, (dgu, dd), inter


@pytest.mark.parametrize("block_major", [False, True])
@pytest.mark.parametrize("tiles", [MoeTiles(16, 32, 64, block_n_down=16), MoeTiles(16, 16, 128),  # 128: cut to 64
                                   MoeTiles(16, 32, 32), MoeTiles(16, 64, 16)])
def test_codes_as_e4m3_match_dequantized_fp64(tiles, block_major):
    """One, two and four 16-wide sub-blocks a K step (BLOCK_K 16 / 32 / 64; 128 runs as 64); other ranks' ids."""
    g, (pgu, pd), scales, (dgu, dd), i = _experts(7)
    gu, d = quant.e2m1_as_e4m3(pgu), quant.e2m1_as_e4m3(pd)
    if block_major:
        gu, d = quant.block_major(gu, quant.NV_BLOCK), quant.block_major(d, quant.NV_BLOCK)
    n_tok, top_k = 6, 2
    ids = torch.randint(-1, 6, (n_tok, top_k), generator=g, dtype=torch.int32)
    ids[0] = torch.arange(top_k)
    x, w = torch.randn(n_tok, 128, generator=g), torch.rand(n_tok, top_k, generator=g) + 0.1
    assert first_generation(scales, gu[:, :i])
    got = fused_moe(x, gu[:, :i], gu[:, i:], d, ids, w, backend=T, tiles=tiles, scales=scales)
    want = fused_moe_ref(x.double(), dgu[:, :i], dgu[:, i:], dd, ids, w.double())
    assert torch.allclose(got.double(), want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
    packed_torch = fused_moe(x, pgu[:, :i], pgu[:, i:], pd, ids, w, backend=KernelBackend.TORCH, scales=scales)
    codes_torch = fused_moe(x, gu[:, :i], gu[:, i:], d, ids, w, backend=KernelBackend.TORCH, scales=scales)
    assert torch.equal(codes_torch, packed_torch)


def test_a_wrong_global_scale_is_seen():
    """The per-row global multiplies each sub-dot: doubling one expert's down globals doubles its share."""
    g, (pgu, pd), scales, _, i = _experts(9, n_exp=2)
    gu, d = quant.e2m1_as_e4m3(pgu), quant.e2m1_as_e4m3(pd)
    x = torch.randn(3, 128, generator=g)
    ids = torch.tensor([[0, 1]] * 3, dtype=torch.int32)
    w = torch.tensor([[1.0, 0.0]] * 3)  # expert 1 weighs nothing
    base = fused_moe(x, gu[:, :i], gu[:, i:], d, ids, w, backend=T, tiles=MoeTiles(16, 32, 64), scales=scales)
    down_global = scales.down_global.clone()
    down_global[0] *= 2
    twice = MoeScales(scales.gate, scales.up, scales.down, scales.gate_global, scales.up_global, down_global)
    got = fused_moe(x, gu[:, :i], gu[:, i:], d, ids, w, backend=T, tiles=MoeTiles(16, 32, 64), scales=twice)
    assert torch.allclose(got, 2 * base, rtol=1e-5, atol=1e-6)
