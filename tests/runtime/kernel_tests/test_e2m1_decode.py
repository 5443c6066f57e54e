"""The kernels decode NVFP4 nibbles by moving them into fp8 e4m3 codes (values / 64) and letting the
fp8 conversion do the rest: exact for all 16 codes (interpreter)."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq

triton = pytest.importorskip("triton")
tl = triton.language

from m3bench.runtime.kernels.kv_tiles_triton import e2m1_to_f32, nvfp4_to_f16_asm  # noqa: E402  (after the interpreter is set)


@triton.jit
def _decode_kernel(code_ptr, out_ptr):
    i = tl.arange(0, 16)
    tl.store(out_ptr + i, e2m1_to_f32(tl.load(code_ptr + i)))


def test_e2m1_decode_through_e4m3_is_exact_for_every_code(triton_interpreter):
    out = torch.full((16,), float("nan"))
    _decode_kernel[(1,)](torch.arange(16, dtype=torch.int32), out)
    assert torch.equal(out, kq.e2m1_table())


@triton.jit
def _tile_kernel(data_ptr, scale_ptr, gs_ptr, out_ptr, fac_ptr, FMT: tl.constexpr, TILE: tl.constexpr,
                 D: tl.constexpr, ROW: tl.constexpr, SROW: tl.constexpr):
    from m3bench.runtime.kernels.kv_tiles_triton import kv_tile_factor, load_kv_tile

    t = tl.arange(0, TILE).to(tl.int64)
    tile = load_kv_tile(data_ptr, scale_ptr, t * ROW, t * SROW, t < TILE, FMT, TILE, D)  # SROW: scale rows
    tl.store(out_ptr + t[:, None] * D + tl.arange(0, D)[None, :], tile)
    tl.store(fac_ptr, kv_tile_factor(gs_ptr, FMT))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quantized_tiles_decode_exactly_into_fp16(triton_interpreter, fmt):
    # The attention / index kernels dot fp16 tiles: FP8 and NVFP4 (values / 64 times the e4m3 block
    # scale, the global scale and the 64 left to kv_tile_factor) must be exact in fp16.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-3, 3, 16)[:, None]  # scales over 6 decades
    out, fac = torch.full((16, 64), float("nan"), dtype=torch.float16), torch.zeros(1)
    if fmt == "fp8":
        data = kq.quantize_fp8(x)
        _tile_kernel[(1,)](data.view(torch.uint8), data.view(torch.uint8), fac, out, fac, FMT=1, TILE=16, D=64,
                           ROW=64, SROW=64)
        want = data.float()
    else:
        gs = kq.nvfp4_global_scale(x.abs().amax()).reshape(1)
        pages = kq.Nvfp4Pages(*kq.quantize_nvfp4(x, gs), gs)
        _tile_kernel[(1,)](pages.data, pages.scales.view(torch.uint8), gs, out, fac, FMT=2, TILE=16, D=64,
                           ROW=32, SROW=1)
        codes = kq.e2m1_table(dtype=torch.float64)[kq.unpack_e2m1(pages.data).long()]  # exact, in fp64
        want = (codes.unflatten(-1, (-1, 16)) * pages.scales.double()[..., None] * gs.double()).flatten(-2)
    assert torch.isfinite(out).all()
    assert torch.equal(out.double() * fac.double(), want.double())


@triton.jit
def _asm_kernel(byte_ptr, lo_ptr, hi_ptr):
    i = tl.arange(0, 256)
    lo, hi = nvfp4_to_f16_asm(tl.load(byte_ptr + i))
    tl.store(lo_ptr + i, lo)
    tl.store(hi_ptr + i, hi)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="PTX: needs a CUDA device (sm89+)")
def test_nvfp4_ptx_decode_is_exact_for_every_byte():
    # The PTX variant (four bytes a register) against the E2M1 table: both nibbles of all 256 bytes, / 64.
    b = torch.arange(256, dtype=torch.uint8, device="cuda")
    lo, hi = (torch.full((256,), float("nan"), dtype=torch.float16, device="cuda") for _ in range(2))
    _asm_kernel[(1,)](b, lo, hi)
    table = kq.e2m1_table() / 64
    assert torch.equal(lo.cpu().float(), table[b.cpu().long() & 15])
    assert torch.equal(hi.cpu().float(), table[b.cpu().long() >> 4])
