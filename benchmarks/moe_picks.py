"""The routed experts of one TP8/EP8 rank at one token, by how many of its four picks are local (0-4): the fused
MoE's time against that many experts' bytes at the floor. At B1 a rank has no local pick in ~59% of its layers and
one in ~33% (16 of 128 experts), so the 0- and 1-pick rows are what the realistic decode step pays.

    python benchmarks/moe_picks.py            # H100 / H200, < 1 min: bf16 and MXFP8 (block-major) experts
    TRITON_INTERPRET=1 python benchmarks/moe_picks.py --tiny     # CPU smoke run (tiny shapes)

The tiles are the decode step's (kernels.moe.first_generation_tiles at one token, 4 pairs over 16 experts, the
shared expert beside: moe_tiles / mx_moe_tiles while ROUTED_SPLIT_TOKENS is 0), and bf16-split / mxfp8-split the
routed experts' split-K tiles ROUTED_SPLIT_TOKENS would choose (skinny_tiles(I, I, H), mx_split_tiles(I, H)); each
call's picks name other experts than the call before (cold weights: 16 experts are 1.8 GB
in bf16). Times: all calls in one CUDA graph, replayed (kernels_gpu.time_us); floor: the picked experts' bytes at
the device's copy rate (floor_bandwidth.py). Checked first against the fp32 reference at each pick count.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth
from kernels_gpu import time_us
from mxfp8_gpu import MX_BYTES, TINY, Shapes, make_experts, rel_err
from mxfp8_speed_sweep import block_major_experts

from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import first_generation_tiles, fused_moe, mx_split_tiles, skinny_tiles
from m3bench.runtime.kernels.reference import fused_moe_ref

TRITON = KernelBackend.TRITON
CALLS = 16  # calls a replay: each picks other experts


def picks(n_local: int, call: int, sh: Shapes, dev) -> dict:
    """One token's four picks, the first n_local local (experts rotating with the call), the rest another rank's."""
    ids = torch.full((1, sh.top_k), -1, dtype=torch.int32)
    for j in range(n_local):
        ids[0, j] = (call * sh.top_k + j) % sh.n_local
    return {"topk_ids": ids.to(dev), "topk_weights": torch.full((1, sh.top_k), 0.5, device=dev)}


def main(argv=None) -> int:
    tiny = "--tiny" in (sys.argv[1:] if argv is None else argv)
    if not (torch.cuda.is_available() or tiny):
        print("no CUDA device (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    sh = TINY if tiny else Shapes()
    ex = make_experts(sh, dev, gen)
    x = torch.randn(1, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
    expert_bytes = 3 * sh.inter * sh.hidden
    bad = 0
    print(f"{'experts':<13}{'local picks':>12}{'us':>9}{'floor us':>10}{'of floor':>10}{'err':>10}")
    mx = ex.mx
    deq_mx = mx["scales"].dequantized(mx["w_gate"], mx["w_up"], mx["w_down"], torch.float32)
    deq_bf = tuple(ex.bf16[k].float() for k in ("w_gate", "w_up", "w_down"))
    for label, weights, wbytes, tiles, deq in (
            ("bf16", ex.bf16, 2, first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, False), deq_bf),
            ("bf16-split", ex.bf16, 2, skinny_tiles(sh.inter, sh.inter, sh.hidden), deq_bf),
            ("mxfp8", block_major_experts(mx), MX_BYTES,
             first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, True), deq_mx),
            ("mxfp8-split", block_major_experts(mx), MX_BYTES, mx_split_tiles(sh.inter, sh.hidden), deq_mx)):
        for n_local in range(sh.top_k + 1):
            rs = [picks(n_local, c, sh, dev) for c in range(CALLS)]
            got = fused_moe(x, **rs[1], **weights, backend=TRITON, tiles=tiles)
            want = fused_moe_ref(x=x.float(), w_gate=deq[0], w_up=deq[1], w_down=deq[2], **rs[1])
            err = rel_err(got, want) if n_local else float(got.abs().max())
            bad += err > 2e-2
            us = time_us([lambda r=r: fused_moe(x, **r, **weights, backend=TRITON, tiles=tiles) for r in rs])
            floor_us = n_local * expert_bytes * wbytes / peak_bytes_per_s() * 1e6
            share = f"{floor_us / us:9.0%}" if n_local else f"{'-':>9}"
            print(f"{label:<13}{n_local:>12}{us:>9.1f}{floor_us:>10.1f} {share}{err:>10.1e}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
