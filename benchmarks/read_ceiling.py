"""The fastest read of N bytes on this GPU, timed as the kernels are: what a decode kernel of that size can reach.

    us, grid = read_us(nbytes, device)      # best over the candidate grids; every call reads its own copy (cold)
    python benchmarks/read_ceiling.py 0.8e6 12.2e6 56.6e6     # one line per size: us, % of the floor, the grid

A decode GEMM's floor divides its bytes by the device's copy rate (floor_bandwidth.py), a rate only long transfers
reach: a kernel that moves a few MB also pays its launch, its ramp and its last loads' latency. Here a kernel that
reads the bytes and computes nothing (int32 words xor-reduced, one store a program) runs over each candidate grid
(programs x words a load x warps), under the same PDL launch and in the same timed CUDA graph of calls on distinct
copies (kernels_gpu.time_us) as the benchmarks' kernels; the fastest is the size's read ceiling. No kernel that
must read those bytes in one launch is expected to beat it, so "% of the read" says how much of a kernel's time
is its arithmetic and layout rather than the bytes (H100 2026-12-06, docs/performance.md 9f: 0.8 MB reads at 40%
of the copy rate, 12 MB at 75%, 25 MB at 83%).
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import triton
import triton.language as tl
from decode_floor import peak_bytes_per_s
from kernels_gpu import time_us

from m3bench.runtime.kernels.backend import pdl_args, sm_count
from m3bench.runtime.kernels.pdl_triton import pdl_wait

COLD_BYTES = 150e6  # bytes read by one timed graph: > 3x the L2, so every call reads cold data
PROGRAMS_PER_SM = (1, 2, 4, 8)
LOADS = ((1024, 4), (2048, 8))  # int32 words a program loads a step, warps


@triton.jit
def read_kernel(src_ptr, out_ptr, words, chunk, BLOCK_W: tl.constexpr, PDL: tl.constexpr):
    """Program p xor-reduces words [p * chunk, (p + 1) * chunk) of src (int32) and stores the result at out[p]."""
    pdl_wait(PDL)
    acc = tl.zeros([BLOCK_W], tl.int32)
    base = tl.program_id(0).to(tl.int64) * chunk
    for k in range(0, chunk, BLOCK_W):
        off = base + k + tl.arange(0, BLOCK_W)
        acc ^= tl.load(src_ptr + off, mask=off < words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def read(src: torch.Tensor, out: torch.Tensor, programs: int, block_w: int, warps: int) -> None:
    """One read of src (int32, flat) by about `programs` programs of block_w-word loads."""
    words = src.numel()
    chunk = math.ceil(words / programs / block_w) * block_w
    read_kernel[(math.ceil(words / chunk),)](src, out, words, chunk, BLOCK_W=block_w, num_warps=warps,
                                             **pdl_args(src))


def xor_of(src: torch.Tensor) -> int:
    """The xor of src's int32 words (the read's result, for the check)."""
    v = src.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    while v.numel() > 1:
        if v.numel() % 2:
            v = torch.cat([v, v.new_zeros(1)])
        v = v[0::2] ^ v[1::2]
    return int(v[0]) - (1 << 32 if int(v[0]) >= 1 << 31 else 0)


def candidates(sms: int):
    for per_sm, (block_w, warps) in ((p, lw) for p in PROGRAMS_PER_SM for lw in LOADS):
        yield per_sm * sms, block_w, warps


@functools.cache
def read_us(nbytes: int, device: torch.device) -> tuple[float, str]:
    """(us, grid) of the fastest candidate read of nbytes (rounded up to whole int32 words), each call on its own
    copy; the first copy's result checked against torch first (a wrong read raises)."""
    words = max(1, math.ceil(nbytes / 4))
    gpu = device.type == "cuda"
    count = max(4, min(256, math.ceil(COLD_BYTES / (4 * words)))) if gpu else 1
    gen = torch.Generator(device=device).manual_seed(0)
    srcs = [torch.randint(-(1 << 31), 1 << 31, (words,), dtype=torch.int32, device=device, generator=gen)
            for _ in range(count)]
    sms = sm_count(device.index or 0) if gpu else 4
    out = torch.zeros(8 * sms * max(PROGRAMS_PER_SM), dtype=torch.int32, device=device)
    best, want = (math.inf, ""), xor_of(srcs[0])
    for programs, block_w, warps in candidates(sms):
        out.zero_()
        read(srcs[0], out, programs, block_w, warps)
        if xor_of(out) != want:
            raise RuntimeError(f"read of {words} words by {programs} programs returned a wrong xor")
        us = time_us([lambda s=s, p=programs, b=block_w, w=warps: read(s, out, p, b, w) for s in srcs])
        best = min(best, (us, f"{programs} programs x {block_w} words, {warps} warps"), key=lambda b: b[0])
    return best


def main(argv=None) -> int:
    from floor_bandwidth import use_device_bandwidth

    sizes = [float(a) for a in (sys.argv[1:] if argv is None else argv)] or [0.8e6, 3.2e6, 12.2e6, 56.6e6]
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    print(use_device_bandwidth(dev), flush=True)
    for nbytes in sizes:
        us, grid = read_us(int(nbytes), dev)
        floor_us = nbytes / peak_bytes_per_s() * 1e6
        print(f"{nbytes / 1e6:8.2f} MB: read {us:7.2f} us, floor {floor_us:7.2f} us ({floor_us / us:4.0%}); {grid}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
