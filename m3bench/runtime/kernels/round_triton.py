"""Triton rounding helper shared by the fused kernels: fp32 -> the value a bf16 cast would give,
round to nearest even, in integer arithmetic on the bits (the CPU interpreter's bf16 cast
truncates; the GPU's rounds to nearest). The result is exact in bf16, so a final `.to(bf16)`
stores identical bits on both, and identical to torch's casts."""

import triton
import triton.language as tl


@triton.jit
def round_to_bf16(x):
    """fp32 x rounded to the nearest bf16 (ties to even), returned as fp32 (finite inputs)."""
    bits = x.to(tl.int32, bitcast=True)
    up = bits + 0x7FFF + ((bits >> 16) & 1)
    return (up & -65536).to(tl.float32, bitcast=True)


@triton.jit
def round_for(x, dtype: tl.constexpr):
    """fp32 x rounded as a cast to `dtype` would (bf16 explicitly; other dtypes by the cast)."""
    if dtype == tl.bfloat16:
        return round_to_bf16(x)
    else:
        return x.to(dtype).to(tl.float32)
