"""Decode MXFP8 linear kernels (kernels/mx_tiles_triton.py): tile choice, split-K workspace, launch.

    y = mx_linear(x [M, K], weight fp8 [N, K], scale uint8 E8M0 [N, K/32], bias | None, tiles=mx_tiles(M, N, K))

M <= GEMV_MAX_ROWS (one row) runs the GEMV kernel (no tensor cores), larger M the dequantize-then-one-dot
kernel.
K is split as far as one wave of resident programs allows (decode GEMMs are a few MB: a second wave or a
second load round trip costs as much as the transfer); the splits of a tile meet through a
per-tile counter (one zeroed int32 buffer per device, reset by the kernel itself) and an fp32 partial
buffer, so a launch is one kernel. Launches of one lane (kernels/lanes.py: the main stream, or the side stream
beside it) must not overlap in time, as a lane's counters are shared.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import Enum

import torch

from m3bench.runtime.kernels.backend import interpreting, next_pow2, pdl_args, sm_count
from m3bench.runtime.kernels.lanes import current_lane

# One row runs the GEMV: on the H200 (benchmarks/mxfp8_speed.py, 2026-12-02) it beat the dot kernel at
# batch 1 in all six linears (e.g. qkv+index 8.8 against 18.2 us, o_proj 5.1 against 8.4). H100, 2026-12-06
# (docs/performance.md 9f): its inputs read once a K step (sm90 SASS ~7.8 instructions a weight, was ~9.0) ran
# 1.12-1.36x faster on the same tiles, GEMV_BLOCK_K up to 1.2x more; the B1 MXFP8 rank step 8.70 -> 8.35 ms. From
# two rows the first kernel (kernels/quant_kernels.py): the GEMV (101-128 registers there, BLOCK_K 1024 then) lost
# to it in 3 of the 6 linears at two rows and in all 6 at four (mxfp8_speed_sweep.py gemv-tiles).
GEMV_MAX_ROWS = 1
SMS = 132  # H100 / H200
# resident programs an SM holds, from the Triton 3.6 sm90 build (registers a thread; shared memory, 3 stages):
# GEMV 42 x 256 threads; dot BLOCK_M 16: 128 x 128, 58 KB; 32: 155, 83 KB; 64: 128, 66 KB; 128: 188, 115 KB
PER_SM = {"gemv": 6, 16: 3, 32: 2, 64: 3, 128: 2}
MAX_SPLIT = 16
# GEMV tiles at one row (benchmarks/mxfp8_speed_sweep.py gemv-tiles, H100, 2026-12-06, block-major weights): BLOCK_K
# 512 with every split at least two K steps against 1024 and one step: qkv + index 6.9 against 8.3 us, o_proj 4.2
# against 4.9, dense gate|up 11.9 against 12.9, shared gate|up 5.7 against 6.2; dense down and shared down as before
GEMV_BLOCK_K = 512
GEMV_MIN_STEPS = 2
COUNTERS = 1 << 16  # output tiles of one launch, at most


class MxKernel(Enum):
    GEMV = "gemv"
    DOT = "dot"


@dataclass(frozen=True)
class MxTiles:
    kernel: MxKernel
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def grid(self, m: int, n: int) -> tuple[int, int]:
        m_tiles = 1 if self.kernel is MxKernel.GEMV else math.ceil(m / self.block_m)
        return m_tiles * math.ceil(n / self.block_n), self.split_k


def block_k_for(k: int, largest: int) -> int:
    """The largest power-of-two BLOCK_K <= largest (>= 32) that divides K (K a multiple of 32)."""
    bk = largest
    while bk > 32 and k % bk:
        bk //= 2
    return bk


def split_for(tiles: int, k: int, block_k: int, capacity: int, min_steps: int = 1) -> int:
    """The largest divisor of K / BLOCK_K (<= MAX_SPLIT) that keeps the grid within one wave of `capacity`
    programs (1 when the tiles alone fill it) and each split at `min_steps` BLOCK_K steps or more: every load of
    the GEMM in flight at once, no tail wave."""
    steps = k // block_k
    fits = [d for d in range(1, min(steps, MAX_SPLIT) + 1)
            if steps % d == 0 and tiles * d <= capacity and steps // d >= min_steps]
    return fits[-1] if fits else 1


def mx_tiles(m: int, n: int, k: int, kernel: MxKernel | None = None, sms: int = SMS) -> MxTiles:
    """Decode tiles, one wave of programs on `sms` SMs. GEMV (M <= GEMV_MAX_ROWS): BLOCK_N 16, BLOCK_K GEMV_BLOCK_K
    (or the largest power of two dividing K), 8 warps. Dot: BLOCK_N 64 (one wgmma row group), BLOCK_M the
    batch padded to 16..64 (128 past 64 rows: prefill), BLOCK_K 256 (128 from BLOCK_M 64: two programs'
    stages fit an SM)."""
    kernel = kernel or (MxKernel.GEMV if m <= GEMV_MAX_ROWS else MxKernel.DOT)
    if kernel is MxKernel.GEMV:
        bk = block_k_for(k, GEMV_BLOCK_K)
        return MxTiles(kernel, next_pow2(max(1, m)), 16, bk,
                       split_for(math.ceil(n / 16), k, bk, PER_SM["gemv"] * sms, GEMV_MIN_STEPS), 8, 1)
    bm = min(128 if m > 64 else 64, max(16, next_pow2(m)))  # prefill: 128 rows a tile, fewer re-dequantizations
    bk = block_k_for(k, 256 if bm <= 32 else 128)
    cap = PER_SM[bm] * sms
    return MxTiles(kernel, bm, 64, bk, split_for(math.ceil(m / bm) * math.ceil(n / 64), k, bk, cap), 4, 3)


@functools.cache
def _counters(device: torch.device, lane: int) -> torch.Tensor:
    return torch.zeros(COUNTERS, dtype=torch.int32, device=device)


def split_counters(device: torch.device, lane: int | None = None) -> torch.Tensor:
    """The device's zeroed per-tile counters of a lane (kernels/lanes.py; default the current one; each launch
    leaves them zero)."""
    return _counters(torch.device(device.type, device.index if device.index is not None else 0)
                     if device.type == "cuda" else device, current_lane() if lane is None else lane)


def block_stride(w: torch.Tensor, dims: int, width: int = 32) -> int:
    """The stride between a row's width-wide input blocks (32: MXFP8; 16: NVFP4 codes as e4m3 bytes) of weights
    of `dims` dims ([N, K]: 2, experts [E, N, K]: 3): the width row-major; a block-major view ([..., N, K/w, w]
    over [..., K/w, N, w] storage, quant.block_major) has one more dim and its own block stride."""
    return w.stride(-2) if w.dim() == dims + 1 else width


def check_split(t: MxTiles, m: int, n: int, k: int) -> None:
    """The split K of tiles t divides K, and its output tiles fit the split counters."""
    if k % (t.split_k * t.block_k):
        raise ValueError(f"split_k {t.split_k} x block_k {t.block_k} does not divide K {k}")
    check_counters(t.grid(m, n)[0], t.split_k)


def check_counters(tiles: int, split: int) -> None:
    """A launch of `tiles` output tiles whose K is split `split` ways fits the split counters."""
    if split > 1 and tiles > COUNTERS:
        raise ValueError(f"{tiles} output tiles exceed the {COUNTERS} split counters")


def mx_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
              tiles: MxTiles | None = None) -> torch.Tensor:
    """x [M, K] (contiguous along K) @ dequant(weight, scale)^T (+ bias) -> [M, N] in x's dtype."""
    from m3bench.runtime.kernels import mx_tiles_triton as kt

    if weight.stride(-1) != 1 or scale.stride(-1) != 1:
        raise ValueError("MXFP8 weight and scale must be contiguous along K")
    (m, k), n = x.shape, weight.shape[0]
    t = tiles or mx_tiles(m, n, k, sms=sm_count(x.device.index or 0) if x.is_cuda else SMS)
    if t.kernel is MxKernel.GEMV and m > t.block_m:
        raise ValueError(f"the GEMV kernel takes at most block_m {t.block_m} rows, got {m}")
    check_split(t, m, n, k)
    y = x.new_empty((m, n))
    grid = t.grid(m, n)
    parts = x.new_empty((t.split_k, m, n) if t.split_k > 1 else (1,), dtype=torch.float32)
    args = (x, weight, scale.view(torch.uint8), bias if bias is not None else y, y, parts,
            split_counters(x.device), m, x.stride(0), weight.stride(0), block_stride(weight, 2), scale.stride(0),
            y.stride(0))
    meta = dict(N=n, K=k, K_SPLIT=k // t.split_k, SPLIT=t.split_k, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                BLOCK_K=t.block_k, HAS_BIAS=bias is not None, num_warps=t.num_warps, num_stages=t.num_stages,
                **pdl_args(x))
    if t.kernel is MxKernel.GEMV:
        kt.mx_gemv_kernel[grid](*args, 0, **meta, SCALED=True, EVEN=False)  # 0: the bias's row stride
    else:
        kt.mx_dot_kernel[grid](*args, **meta, F32=x.dtype == torch.float32 or interpreting(),
                               EVEN=n % t.block_n == 0 and k % t.block_k == 0)
    return y
