"""Tile sweep of the MXFP8 linear kernel at one TP8 rank's decode shapes (H200): which BLOCK_N / split-K /
BLOCK_K / stages read the weights fastest, against bf16 F.linear and the HBM floor (weight bytes + scales).

    python benchmarks/mxfp8_tiles.py            # prints the best tiles per (N, K, M) and the current rule's time
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # decode_floor, floor_bandwidth

import torch
import torch.nn.functional as F
import triton.testing
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.mxfp8 import LinearTiles, linear_tiles, mxfp8_linear

SHAPES = ((1536, 6144), (6144, 1024), (3072, 6144), (6144, 1536), (768, 6144), (6144, 384))
BATCHES = (1, 16, 64)


def time_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median") * 1e3


def candidates(m: int, k: int):
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    for bn, split, bk, stages in itertools.product((16, 32, 64, 128), (1, 2, 4, 8, 16), (128, 256), (3, 4)):
        if k % (split * bk) == 0:
            yield LinearTiles(block_m, bn, bk, 4, stages, split)


def sweep_shape(n: int, k: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w, s = quant.quant_mxfp8(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5)
    wb = quant.dequant_mxfp8(w, s, torch.bfloat16)
    floor_us = (n * k + n * k // 32) / peak_bytes_per_s() * 1e6
    for m in BATCHES:
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        ref = F.linear(x.float(), wb.float())
        bf16_us = time_us(lambda: F.linear(x, wb))
        rule = linear_tiles(m, n, k)
        rule_us = time_us(lambda: mxfp8_linear(x, w, s, backend=KernelBackend.TRITON, tiles=rule))
        best = (float("inf"), None)
        for t in candidates(m, k):
            try:
                y = mxfp8_linear(x, w, s, backend=KernelBackend.TRITON, tiles=t)
            except Exception as e:  # a tile that does not fit (shared memory): not a candidate
                print(f"  skip {t}: {type(e).__name__}", file=sys.stderr)
                continue
            if ((y.float() - ref).norm() / ref.norm()).item() > 2e-2:
                print(f"  WRONG {t}", file=sys.stderr)
                continue
            us = time_us(lambda: mxfp8_linear(x, w, s, backend=KernelBackend.TRITON, tiles=t))
            best = min(best, (us, t), key=lambda b: b[0])
        t = best[1]
        print(f"N={n:5d} K={k:5d} M={m:3d}  floor {floor_us:6.1f} us  bf16 {bf16_us:6.1f}  rule {rule_us:6.1f} "
              f"({rule.block_n}/{rule.split_k}/{rule.block_k}/{rule.num_stages})  best {best[0]:6.1f} "
              f"({floor_us / best[0]:4.0%} of HBM) BN {t.block_n} split {t.split_k} BK {t.block_k} stages {t.num_stages}",
              flush=True)


def main() -> int:
    print(use_device_bandwidth(torch.device("cuda")), flush=True)
    for n, k in SHAPES:
        sweep_shape(n, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
