"""Block-scaled weight formats of MiniMax-M3 checkpoints: MXFP8 and NVFP4 (ModelOpt).

    w = dequant_mxfp8(fp8 [out, in], e8m0 [out, in/32], torch.bfloat16)
    w = dequant_nvfp4(packed uint8 [out, in/2], e4m3 [out, in/16], scale_2 fp32 scalar, torch.bfloat16)

The quantizers are the exact inverses used by tests and by tiny quantized checkpoints.
All arithmetic is fp32; the result is cast to the requested dtype at the end.
"""

from __future__ import annotations

import torch

MX_BLOCK = 32  # MXFP8: one E8M0 exponent per 32 input elements
NV_BLOCK = 16  # NVFP4: one e4m3 scale per 16 input elements
E8M0_BIAS = 127
E8M0_NAN = 255
FP8_E4M3_MAX = 448.0
E2M1_MAX = 6.0

# E2M1 magnitudes by 3-bit code; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table() -> torch.Tensor:
    """[16] fp32: the value of every 4-bit E2M1 code (codes 8-15 are the negatives of 0-7)."""
    pos = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    return torch.cat([pos, -pos])


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 exponents (uint8 or float8_e8m0fnu) -> fp32 multipliers 2**(s - 127); 255 is NaN."""
    s = _as_uint8(scale).to(torch.int32)
    out = torch.exp2((s - E8M0_BIAS).to(torch.float32))
    return torch.where(s == E8M0_NAN, torch.full_like(out, float("nan")), out)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n/2] -> fp32 [..., n]; byte k holds element 2k in its low nibble, 2k+1 in its high."""
    b = _as_uint8(packed).to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    return e2m1_table().to(codes.device)[codes]


def dequant_mxfp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8_e4m3fn [out, in] (or its block-major view [out, in/32, 32]) with E8M0 [out, in/32] -> dtype [out, in]."""
    if weight.dim() == scale.dim() + 1:
        weight = row_major(weight)
    _check_blocks(weight.shape, scale.shape, MX_BLOCK, "MXFP8")
    w = weight.to(torch.float32).unflatten(-1, (-1, MX_BLOCK))
    return (w * e8m0_to_float(scale).unsqueeze(-1)).flatten(-2).to(dtype)


def block_major(weight: torch.Tensor, width: int = MX_BLOCK) -> torch.Tensor:
    """MXFP8 weights [..., N, K] laid out block-major: storage [..., K/width, N, width], so that one width-wide
    input block of consecutive rows is one contiguous run (the MXFP8 kernels load a K step a block at a time);
    returned as the view [..., N, K/width, width] the kernels read (kernels/mxfp8.block_stride). row_major()
    undoes it. width: 32 for MXFP8, 16 for NVFP4 codes held as e4m3 bytes (e2m1_as_e4m3)."""
    *lead, n, k = weight.shape
    return weight.reshape(*lead, n, k // width, width).transpose(-3, -2).contiguous().transpose(-3, -2)


def row_major(weight: torch.Tensor) -> torch.Tensor:
    """[..., N, K/32, 32] (a block-major view) -> [..., N, K] row-major (a copy)."""
    return weight.flatten(-2).contiguous()


def dequant_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                  dtype: torch.dtype) -> torch.Tensor:
    """uint8 [out, in/2] (two E2M1 a byte; or the codes as e4m3 bytes [out, in], e2m1_as_e4m3, row- or
    block-major) with e4m3 [out, in/16] and fp32 scale_2 -> dtype [out, in]; scale_2 is one scalar, or one per
    row ([..., out]: stacked experts with their own global scales)."""
    if packed.dtype == torch.float8_e4m3fn:
        w = (row_major(packed) if packed.dim() == scale.dim() + 1 else packed).to(torch.float32)
    else:
        w = unpack_e2m1(packed)
    _check_blocks(w.shape, scale.shape, NV_BLOCK, "NVFP4")
    g = scale_2.to(torch.float32)
    s = scale.to(torch.float32) * (g.reshape(()) if g.numel() == 1 else g.unsqueeze(-1))
    return (w.unflatten(-1, (-1, NV_BLOCK)) * s.unsqueeze(-1)).flatten(-2).to(dtype)


def e2m1_as_e4m3(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 codes uint8 [..., K/2] -> float8_e4m3fn [..., K], each code as the e4m3 byte of its value:
    exact (every E2M1 value is an e4m3 value), so the NVFP4 scales apply unchanged. e4m3_as_e2m1 undoes it."""
    return unpack_e2m1(packed).to(torch.float8_e4m3fn)


def e4m3_as_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [..., K] holding E2M1 values (e2m1_as_e4m3) -> their packed codes uint8 [..., K/2]."""
    return pack_e2m1(round_to_e2m1_codes(codes.to(torch.float32)))


def quant_mxfp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (float8_e4m3fn [out, in], uint8 E8M0 [out, in/32]); each block's amax fits 448."""
    blocks = w.to(torch.float32).unflatten(-1, (-1, MX_BLOCK))
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -120)
    exp = torch.ceil(torch.log2(amax / FP8_E4M3_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)
    q = (blocks / torch.exp2(exp).unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return q.flatten(-2).to(torch.float8_e4m3fn), (exp + E8M0_BIAS).to(torch.uint8)


def quant_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[out, in] -> (uint8 [out, in/2], float8_e4m3fn [out, in/16], fp32 scalar scale_2)."""
    blocks = w.to(torch.float32).unflatten(-1, (-1, NV_BLOCK))
    scale_2 = (blocks.abs().amax() / (FP8_E4M3_MAX * E2M1_MAX)).clamp(min=1e-30)
    block_scale = (blocks.abs().amax(-1) / E2M1_MAX / scale_2).clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (block_scale.to(torch.float32) * scale_2).unsqueeze(-1)
    scaled = torch.where(denom > 0, blocks / denom.clamp(min=1e-30), torch.zeros_like(blocks))
    return pack_e2m1(round_to_e2m1_codes(scaled.flatten(-2))), block_scale, scale_2.reshape(())


def round_to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> int64 E2M1 codes, round to nearest (ties to the even code), saturating at +-6."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=x.device)
    dist = (x.abs().clamp(max=E2M1_MAX).unsqueeze(-1) - mags).abs()
    # ties go to the lower code when it is even, which argmin's first-index rule and this tweak give
    dist = dist + (torch.arange(8, device=x.device) % 2).to(torch.float32) * 1e-7
    code = dist.argmin(-1)
    return torch.where((x < 0) & (code > 0), code + 8, code)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """int codes [..., n] -> uint8 [..., n/2], element 2k in the low nibble."""
    pairs = codes.to(torch.int64).unflatten(-1, (-1, 2))
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def _as_uint8(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.dtype in (torch.int8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        return t.view(torch.uint8)
    raise ValueError(f"expected uint8 / E8M0 data, got {t.dtype}")


def _check_blocks(w_shape: torch.Size, s_shape: torch.Size, block: int, fmt: str) -> None:
    if w_shape[-1] % block or tuple(s_shape) != (*w_shape[:-1], w_shape[-1] // block):
        raise ValueError(f"{fmt} scale shape {tuple(s_shape)} does not match weight {tuple(w_shape)} "
                         f"(one scale per {block} inputs)")
