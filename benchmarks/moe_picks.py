"""The routed experts of one TP8/EP8 rank at one token, by how many of its four picks are local (0-4): the fused
MoE's time against that many experts' bytes at the floor. At B1 a rank has no local pick in ~59% of its layers and
one in ~33% (16 of 128 experts), so the 0- and 1-pick rows are what the realistic decode step pays.

    python benchmarks/moe_picks.py            # H100 / H200, < 1 min: bf16 and MXFP8 (block-major) experts
    python benchmarks/moe_picks.py --sweep    # ~2 min: one-token split tiles and GEMVs at one local pick, the best six
                                              #   (and the rule's) at 0-3 picks, a B1 mix (0.59 / 0.33 / 0.07 / 0.01)
    TRITON_INTERPRET=1 python benchmarks/moe_picks.py --tiny     # CPU smoke run (tiny shapes)

The rows bf16-split / mxfp8-split run the decode step's tiles (kernels.moe.first_generation_tiles at one token, 4
pairs over 16 experts, the shared expert beside: routed_split_tiles / mx_split_tiles at ROUTED_SPLIT_TOKENS 1, the
default, their down GEMM's K in ROUTED_SPLIT_DOWN chunks), -split-down1 / -down2 / -down4 the same with the down
GEMM's K whole / in 2 / 4 chunks (those other than the rule's), bf16 / mxfp8 the unsplit grid (moe_tiles /
mx_moe_tiles, what ROUTED_SPLIT_TOKENS 0 runs), bf16-gemv / mxfp8-gemv the one-token GEMVs (kernels/moe_gemv.py,
gemv_tiles: what ROUTED_GEMV_FMTS turns on); each call's picks name other experts than the call before (cold
weights: 16 experts are 1.8 GB in bf16). Times: all calls in one CUDA graph, replayed (kernels_gpu.time_us); floor:
the picked experts' bytes at the device's copy rate (floor_bandwidth.py). Checked first against the fp32 reference
at each pick count.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth
from kernels_gpu import time_us
from mxfp8_gpu import MX_BYTES, TINY, Shapes, block_major_experts, make_experts, rel_err

from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeTiles, first_generation_tiles, fused_moe, gemv_tiles, moe_tiles, mx_moe_tiles
from m3bench.runtime.kernels.reference import fused_moe_ref

TRITON = KernelBackend.TRITON
CALLS = 16  # calls a replay: each picks other experts
B1_MIX = (0.59, 0.33, 0.07, 0.01)  # a B1 rank's MoE layers with 0, 1, 2, 3 local picks (16 of 128 experts, top-4)


def picks(n_local: int, call: int, sh: Shapes, dev) -> dict:
    """One token's four picks, the first n_local local (experts rotating with the call), the rest another rank's."""
    ids = torch.full((1, sh.top_k), -1, dtype=torch.int32)
    for j in range(n_local):
        ids[0, j] = (call * sh.top_k + j) % sh.n_local
    return {"topk_ids": ids.to(dev), "topk_weights": torch.full((1, sh.top_k), 0.5, device=dev)}


@dataclass(frozen=True)
class Experts:
    """One weight format's experts: label, kernel arguments, bytes a weight, fp32 dequantized (gate, up, down)."""

    label: str
    weights: dict
    bytes_per_weight: float
    dequantized: tuple
    quantized: bool


def formats(sh: Shapes, dev, gen) -> list[Experts]:
    ex = make_experts(sh, dev, gen)
    mx = ex.mx
    return [Experts("bf16", ex.bf16, 2, tuple(ex.bf16[k].float() for k in ("w_gate", "w_up", "w_down")), False),
            Experts("mxfp8", block_major_experts(mx), MX_BYTES,
                    mx["scales"].dequantized(mx["w_gate"], mx["w_up"], mx["w_down"], torch.float32), True)]


def measure(x, ex: Experts, tiles, n_local: int, sh: Shapes) -> tuple[float, float, float]:
    """(us a call, floor us, error against the fp32 reference; at 0 picks the largest output) on these tiles."""
    dev = x.device
    rs = [picks(n_local, c, sh, dev) for c in range(CALLS)]
    got = fused_moe(x, **rs[1], **ex.weights, backend=TRITON, tiles=tiles)
    deq = ex.dequantized
    want = fused_moe_ref(x=x.float(), w_gate=deq[0], w_up=deq[1], w_down=deq[2], **rs[1])
    err = rel_err(got, want) if n_local else float(got.abs().max())
    us = time_us([lambda r=r: fused_moe(x, **r, **ex.weights, backend=TRITON, tiles=tiles) for r in rs])
    floor_us = n_local * 3 * sh.inter * sh.hidden * ex.bytes_per_weight / peak_bytes_per_s() * 1e6
    return us, floor_us, err


def other_downs(rule: MoeTiles) -> list[tuple[int, MoeTiles]]:
    """The rule's tiles with their down GEMM's K in 1 / 2 / 4 chunks, the rule's own count left out."""
    return [(d, replace(rule, split_down=d)) for d in (1, 2, 4) if d != rule.split_down]


def by_picks(x, fmts: list[Experts], sh: Shapes) -> int:
    """Each format on the unsplit grid and on the decode step's (split) tiles at 0..top_k local picks."""
    bad = 0
    print(f"{'experts':<13}{'local picks':>12}{'us':>9}{'floor us':>10}{'of floor':>10}{'err':>10}")
    for ex in fmts:
        unsplit = (mx_moe_tiles(sh.top_k, sh.n_local, sh.inter, sh.hidden) if ex.quantized
                   else moe_tiles(sh.top_k, sh.n_local, sh.inter, sh.hidden, 0, 1))
        rule = first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, ex.quantized)
        downs = [(f"{ex.label}-split-down{d}", tiles) for d, tiles in other_downs(rule)]
        gemv = (f"{ex.label}-gemv", gemv_tiles(sh.inter, sh.hidden))
        for label, tiles in ((ex.label, unsplit), (f"{ex.label}-split", rule), *downs, gemv):
            for n_local in range(sh.top_k + 1):
                us, floor_us, err = measure(x, ex, tiles, n_local, sh)
                bad += err > 2e-2
                share = f"{floor_us / us:9.0%}" if n_local else f"{'-':>9}"
                print(f"{label:<13}{n_local:>12}{us:>9.1f}{floor_us:>10.1f} {share}{err:>10.1e}", flush=True)
    return bad


def candidates(ex: Experts, sh: Shapes) -> list[tuple[str, MoeTiles]]:
    """The rule's split tiles, with its down GEMM's K in 1 / 2 / 4 chunks, then BLOCK_N 32 / 64 x BLOCK_K 64 / 128
    (plain; quantized 128) x 1-8 K chunks x down N tiles 16 / 32 / 64 with the rule's down chunks (4 warps; 4 stages
    at BLOCK_K 64, else 3), the rule's own left out; then the one-token GEMVs (16 rows a tile, one stage) at BLOCK_K
    256 / 512 x gate|up K in 1 / 2 / 4 pieces x down K in 1 / 2 / 4 chunks x 4 / 8 warps."""
    rule = first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, ex.quantized)
    out = [("rule", rule)] + [(f"rule down{d}", tiles) for d, tiles in other_downs(rule)]
    for bn, bk, split, bn_down in itertools.product((32, 64), (128,) if ex.quantized else (64, 128), (1, 2, 4, 8),
                                                    (16, 32, 64)):
        tiles = MoeTiles(16, bn, bk, 4, 4 if bk == 64 else 3, bn_down, split, split, rule.split_down)
        if sh.hidden % (split * bk) == 0 and tiles != rule:
            out.append((f"bn{bn} bk{bk} split{split} down{bn_down}", tiles))
    for bk, split, down, warps in itertools.product((256, 512), (1, 2, 4), (1, 2, 4), (4, 8)):
        tiles = MoeTiles(16, 16, bk, warps, 1, 16, split, split, down, gemv=True)
        if sh.hidden % (split * bk) == 0 and sh.inter % bk == 0:
            out.append((f"gemv bk{bk} split{split} down{down} w{warps}", tiles))
    return out


def sweep(x, fmts: list[Experts], sh: Shapes, best: int = 6) -> int:
    """One local pick on every candidate, then the best and the rule at 0-3 picks with the B1 mix of them."""
    bad = 0
    for ex in fmts:
        rows = []
        for name, tiles in candidates(ex, sh):
            us, floor_us, err = measure(x, ex, tiles, 1, sh)
            bad += err > 2e-2
            rows.append((us, name, tiles))
            print(f"{ex.label:<7}{name:<28} 1 pick {us:7.1f} us (floor {floor_us:.1f}) err {err:.1e}", flush=True)
        rows.sort(key=lambda r: r[0])
        print(f"{ex.label}: the best {best} at one pick and the rule, us at 0-3 picks; mix = the B1 mix of them")
        for us1, name, tiles in rows[:best] + [r for r in rows[best:] if r[1] == "rule"]:
            at = [us1 if n == 1 else measure(x, ex, tiles, min(n, sh.top_k), sh)[0] for n in range(4)]
            mix = sum(w * t for w, t in zip(B1_MIX, at))
            print(f"{ex.label:<7}{name:<28}" + "".join(f"{n}:{t:7.1f} " for n, t in enumerate(at))
                  + f" mix {mix:6.1f}", flush=True)
    return bad


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tiny = "--tiny" in args
    if not (torch.cuda.is_available() or tiny):
        print("no CUDA device (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    sh = TINY if tiny else Shapes()
    fmts = formats(sh, dev, gen)
    x = torch.randn(1, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
    bad = sweep(x, fmts, sh, best=1 if tiny else 6) if "--sweep" in args else by_picks(x, fmts, sh)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
