"""MXFP8 GEMM and MXFP8 fused MoE (Triton interpreter) against dequantize-then-matmul in fp32."""

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, MoeTiles, fused_moe
from m3bench.runtime.kernels.moe_quant import QuantMoeTiles
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles
from m3bench.runtime.kernels.mxfp8 import LinearTiles, mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref
from .quant_cases import mx_random, nv_random_experts

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON


_mx = mx_random


@pytest.mark.parametrize("m, n, k, tiles", [(1, 48, 64, LinearTiles(16, 16, 32)), (5, 40, 96, LinearTiles(16, 32, 64)),
                                             (33, 24, 128, None), (2, 40, 256, LinearTiles(16, 16, 32, split_k=4)),
                                             (3, 40, 256, LinearTiles(16, 16, 128)),
                                             (3, 24, 512, None),
                                             (40, 48, 1536, None)])  # 33-64 rows: ROWS64's tiles, K in 2 pieces
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


def test_first_kernel_split_k_is_one_launch_and_repeats(monkeypatch):
    """With K split, the first kernel's splits meet in the kernel (the split counters, left zero): one launch, no
    torch sum after it, the same bits on a second call, the bias added once."""
    from m3bench.runtime.kernels import mxfp8_triton
    from m3bench.runtime.kernels.mx_linear import split_counters

    kernel, launches = mxfp8_triton.mxfp8_linear_kernel, []

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(mxfp8_triton, "mxfp8_linear_kernel", Counting())
    monkeypatch.setattr(torch.Tensor, "sum", lambda *a, **k: pytest.fail("a torch sum after the kernel"))
    g = torch.Generator().manual_seed(21)
    w, s = _mx(g, 40, 512)
    x, b = torch.randn(3, 512, generator=g).to(torch.bfloat16), torch.randn(40, generator=g).to(torch.bfloat16)
    tiles = LinearTiles(16, 16, 64, split_k=4)
    got = mxfp8_linear(x, w, s, b, backend=T, tiles=tiles)
    assert launches == [(3, 4)] and not split_counters(x.device).any()
    assert torch.equal(mxfp8_linear(x, w, s, b, backend=T, tiles=tiles), got)
    want = torch.nn.functional.linear(x.double(), quant.dequant_mxfp8(w, s, torch.float64), b.double())
    assert got.dtype == torch.bfloat16 and torch.allclose(got.double(), want, atol=2e-2, rtol=1e-2)


def test_decode_tiles_split_k_to_one_wave():
    from m3bench.runtime.kernels.mxfp8 import linear_tiles

    t = linear_tiles(1, 1536, 6144)  # 24 N tiles of 64, 16 K pieces: 384 programs, one wave of 3 an SM
    assert (t.block_m, t.block_n, t.split_k) == (16, 64, 16)
    assert linear_tiles(3, 24, 512).split_k == 2  # 2 steps a split
    # one TP8 rank's linears at 4 rows as the H100 sweep of 2026-12-06 found fastest (benchmarks/mxfp8_speed_sweep.py
    # linear-v1-tiles): qkv + index 12 splits, o_proj 4, dense gate|up 8, shared gate|up 32-wide tiles x 16
    got = {(n, k): (linear_tiles(4, n, k).block_n, linear_tiles(4, n, k).split_k)
           for n, k in ((1920, 6144), (6144, 1024), (3072, 6144), (768, 6144), (6144, 384))}
    assert got == {(1920, 6144): (64, 12), (6144, 1024): (64, 4), (3072, 6144): (64, 8), (768, 6144): (32, 16),
                   (6144, 384): (64, 1)}  # shared down: three steps, not split
    assert all(linear_tiles(16, n, k) == linear_tiles(4, n, k) for n, k in got)
    # 33-64 rows (BLOCK_M 64): two programs an SM, at least 6 K steps a split, 4 warps (mxfp8.ROWS64), as the H100
    # sweep of 2026-12-07 found at 64 rows (dot-tiles): o_proj, dense down and shared down unsplit, dense gate|up 4,
    # shared gate|up 64-wide x 8
    rows64 = {(n, k): (linear_tiles(m, n, k).block_n, linear_tiles(m, n, k).split_k, linear_tiles(m, n, k).num_warps)
              for m in (33, 64) for n, k in ((6144, 1024), (3072, 6144), (768, 6144), (6144, 384))}
    assert rows64 == {(6144, 1024): (64, 1, 4), (3072, 6144): (64, 4, 4), (768, 6144): (64, 8, 4),
                      (6144, 384): (64, 1, 4)}


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


@pytest.mark.parametrize("tiles", [MoeTiles(16, 16, 32), MoeTiles(16, 32, 64, block_n_down=16), MoeTiles(16, 32, 128)])
def test_mxfp8_fused_moe_matches_dequantized_fp32(tiles):
    """One, two and four E8M0 blocks a K step (mx_weight_blocks' three cases; 128 > hidden: the masked tail)."""
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


@pytest.mark.parametrize("split_down", [1, 2])
@pytest.mark.parametrize("local", [0, 1, 2])
def test_mxfp8_routed_experts_split_k_at_one_token(monkeypatch, local, split_down):
    """One token, 0-2 of its four picks local, MXFP8 experts on mx_split_tiles (K split, the partials summed and
    activated by each tile's last K chunk; with ROUTED_SPLIT_DOWN 2 the down GEMM's too, summed by the sum kernel),
    row- and block-major: dequantize-then-matmul in fp64; the split tiles fill the GPU with one active expert at one
    rank's shapes."""
    from m3bench.runtime.kernels import moe
    from m3bench.runtime.kernels.moe import MIN_PROGRAMS, gate_up_programs, mx_split_tiles

    g = torch.Generator().manual_seed(60 + local)
    n_exp, hidden, inter = 6, 256, 160
    (wgu, sgu), (wd, sd) = _mx(g, n_exp, 2 * inter, hidden), _mx(g, n_exp, hidden, inter)
    ids = torch.tensor([[1, 4, -1, -1][:local] + [-1] * (4 - local)], dtype=torch.int32)
    x, w = torch.randn(1, hidden, generator=g) * 2, torch.rand(1, 4, generator=g) + 0.1
    scales = MoeScales(sgu[:, :inter], sgu[:, inter:], sd)
    monkeypatch.setattr(moe, "ROUTED_SPLIT_DOWN", split_down)
    tiles = mx_split_tiles(inter, hidden)
    assert tiles.split_k == tiles.split_k_routed == 2  # hidden 256: two K steps of 128
    assert tiles.split_down == split_down  # 160 inputs: a step of 128 and one of 32
    dq = lambda a, s: quant.dequant_mxfp8(a, s, torch.float64)  # noqa: E731
    want = fused_moe_ref(x.double(), dq(wgu, sgu)[:, :inter], dq(wgu, sgu)[:, inter:], dq(wd, sd), ids, w.double())
    bgu, bd = quant.block_major(wgu), quant.block_major(wd)
    for gu, d in ((wgu, wd), (bgu, bd)):
        got = fused_moe(x, gu[:, :inter], gu[:, inter:], d, ids, w, backend=T, tiles=tiles, scales=scales)
        assert torch.allclose(got.double(), want, atol=1e-3, rtol=1e-4)
    rank = mx_split_tiles(3072, 6144)
    assert gate_up_programs(3072, 0, rank.split_k, rank) >= MIN_PROGRAMS and rank.split_k == 8


def test_block_major_weights_give_the_same_results():
    """quant.block_major weights (a K step's 32-wide block of consecutive rows contiguous) through the first
    kernels: the same sums in the same order, so bit for bit the row-major results; the torch path reads them too."""
    g = torch.Generator().manual_seed(11)
    w, s = _mx(g, 40, 256)
    x = torch.randn(3, 256, generator=g)
    for tiles in (LinearTiles(16, 16, 64), LinearTiles(16, 32, 128, split_k=2),
                  MxTiles(MxKernel.GEMV, 4, 16, 64, 2, 4, 1), MxTiles(MxKernel.DOT, 16, 16, 128, 2, 4, 2)):
        want = mxfp8_linear(x, w, s, backend=T, tiles=tiles)
        assert torch.equal(mxfp8_linear(x, quant.block_major(w), s, backend=T, tiles=tiles), want)
    assert torch.equal(mxfp8_linear(x, quant.block_major(w), s, backend=KernelBackend.TORCH),
                       mxfp8_linear(x, w, s, backend=KernelBackend.TORCH))
    n_exp, hidden, inter = 3, 64, 96
    (wgu, sgu), (wd, sd) = _mx(g, n_exp, 2 * inter, hidden), _mx(g, n_exp, hidden, inter)
    ids = torch.randint(0, n_exp, (5, 2), generator=g, dtype=torch.int32)
    x, rw = torch.randn(5, hidden, generator=g), torch.rand(5, 2, generator=g)
    scales = MoeScales(sgu[:, :inter], sgu[:, inter:], sd)
    bgu, bd = quant.block_major(wgu), quant.block_major(wd)
    for tiles in (MoeTiles(16, 32, 64, block_n_down=16), MoeTiles(16, 16, 128)):
        want = fused_moe(x, wgu[:, :inter], wgu[:, inter:], wd, ids, rw, backend=T, tiles=tiles, scales=scales)
        got = fused_moe(x, bgu[:, :inter], bgu[:, inter:], bd, ids, rw, backend=T, tiles=tiles, scales=scales)
        assert torch.equal(got, want)
    assert torch.equal(fused_moe(x, bgu[:, :inter], bgu[:, inter:], bd, ids, rw, backend=KernelBackend.TORCH,
                                 scales=scales),
                       fused_moe(x, wgu[:, :inter], wgu[:, inter:], wd, ids, rw, backend=KernelBackend.TORCH,
                                 scales=scales))


_nv = nv_random_experts


@pytest.mark.parametrize("tiles", [MoeTiles(16, 16, 32), MoeTiles(16, 32, 64, block_n_down=16)])
def test_nvfp4_fused_moe_matches_dequantized_fp32(tiles):
    g = torch.Generator().manual_seed(8)
    n_tok, top_k, n_exp, hidden, inter = 6, 2, 4, 64, 96
    (pgu, sgu, ggu), (pd, sd, gd) = _nv(g, n_exp, 2 * inter, hidden), _nv(g, n_exp, hidden, inter)
    ids = torch.randint(-1, n_exp + 1, (n_tok, top_k), generator=g, dtype=torch.int32)
    ids[0] = torch.arange(top_k)
    x, w = torch.randn(n_tok, hidden, generator=g), torch.rand(n_tok, top_k, generator=g) + 0.1
    i = inter
    scales = MoeScales(sgu[:, :i], sgu[:, i:], sd, ggu[:, :i], ggu[:, i:], gd)
    got = fused_moe(x, pgu[:, :i], pgu[:, i:], pd, ids, w, backend=T, tiles=tiles, scales=scales)
    dgu, dd = quant.dequant_nvfp4(pgu, sgu, ggu, torch.float64), quant.dequant_nvfp4(pd, sd, gd, torch.float64)
    want = fused_moe_ref(x.double(), dgu[:, :i], dgu[:, i:], dd, ids, w.double())
    assert torch.allclose(got.double(), want, atol=1e-3 * want.abs().max().item(), rtol=1e-4)
    torch_path = fused_moe(x, pgu[:, :i], pgu[:, i:], pd, ids, w, backend=KernelBackend.TORCH, scales=scales)
    assert torch.allclose(torch_path.double(), want, atol=1e-3 * want.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("tiles", [MoeTiles(16, 32, 64), QuantMoeTiles(16, 32, 64)])  # first kernels, new ones
def test_nvfp4_tile_decodes_every_code(tiles):
    """All 16 E2M1 codes in both nibbles, through the kernel (one expert, identity routing)."""
    codes = torch.arange(16).repeat(4)  # 64 inputs
    packed = quant.pack_e2m1(codes.view(1, -1).expand(32, -1)).view(1, 32, 32)
    scale = torch.ones(1, 32, 4).to(torch.float8_e4m3fn)
    glob = torch.full((1, 32), 0.5)
    want = quant.dequant_nvfp4(packed[0], scale[0], glob[0], torch.float32)
    assert want[0, :16].tolist() == [0.5 * v for v in quant.e2m1_table().tolist()]
    down_p, down_s, down_g = _nv(torch.Generator().manual_seed(1), 1, 64, 32)
    x = torch.eye(64)[:3]
    ids, w = torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, 1)
    scales = MoeScales(scale, scale, down_s, glob, glob, down_g)
    got = fused_moe(x, packed, packed, down_p, ids, w, backend=T, tiles=tiles, scales=scales)
    ref = fused_moe(x, packed, packed, down_p, ids, w, backend=KernelBackend.TORCH, scales=scales)
    assert torch.allclose(got, ref, atol=1e-5)
