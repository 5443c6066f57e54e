"""Tile sweep of the new MXFP8 / NVFP4 decode kernels on the H200 (what mx_linear.mx_tiles and
moe_quant.quant_moe_tiles should pick): every candidate checked against fp32, timed on cold weights.

    python benchmarks/mxfp8_speed_sweep.py linear     # < 4 min each: the rule's tiles and the best candidate
    python benchmarks/mxfp8_speed_sweep.py moe
    python benchmarks/mxfp8_speed_sweep.py moe-v1     # the first-generation MXFP8 MoE (what AUTO runs)
    python benchmarks/mxfp8_speed_sweep.py linear-v1  # its linears at 4 / 16 rows; both: row- and block-major
    python benchmarks/mxfp8_speed_sweep.py linear-v1-tiles   # their tiles (block-major): rule and best candidate
    python benchmarks/mxfp8_speed_sweep.py gemv-tiles  # the GEMV's tiles at one row, every linear (block-major)
    python benchmarks/mxfp8_speed_sweep.py dot-tiles   # 64 rows, every linear: the dot's and the first kernel's tiles

Linear rows: qkv+index [1536, 6144] and o_proj [6144, 1024] of a TP8 rank at batch 1, 4, 16, 64 (GEMV and
dot kernels, BLOCK_N / BLOCK_K / stages / split targets); MoE rows: moe-local (16 experts, every pick local)
at batch 1, 16, 64 in MXFP8 and NVFP4 (BLOCK_N, BLOCK_K, stages, warps); moe-v1 rows: the first generation's
MoeTiles for MXFP8 experts, moe-local and moe-ep (top-4 over 128) at batch 1, 4, 16, 64. One line per row:
rule us, best us, the best tiles, % of the floor (the device's copy rate, floor_bandwidth.py) for both.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from kernels_gpu import time_us
from mxfp8_gpu import MX_BYTES, NV_BYTES, Shapes, block_major_experts, make_experts, rel_err, routing
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth
from mxfp8_speed import copies, linear_weights

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend, next_pow2
from m3bench.runtime.kernels.moe import MoeTiles, fused_moe, mx_moe_tiles
from m3bench.runtime.kernels.moe_quant import quant_moe_tiles
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles, block_k_for, mx_tiles, split_for
from m3bench.runtime.kernels.mxfp8 import mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref

TRITON = KernelBackend.TRITON


def linear_candidates(m: int, n: int, k: int):
    """GEMV (to 4 rows) and dot tiles around the rule's: BLOCK_N, BLOCK_K, the wave size split K targets."""
    kinds = [MxKernel.GEMV, MxKernel.DOT] if m <= 4 else [MxKernel.DOT]
    for kind in kinds:
        gemv = kind is MxKernel.GEMV
        bns, bks, caps = ((16, 32), (512, 1024), (528, 924, 1848)) if gemv else ((64, 128), (128, 256), (264, 396))
        for bn, bk, cap in itertools.product(bns, bks, caps):
            bk = block_k_for(k, bk)
            bm = next_pow2(m) if gemv else min(64, max(16, next_pow2(m)))
            tiles = (1 if gemv else -(-m // bm)) * -(-n // bn)
            warps = 8 if gemv or bn == 128 else 4
            yield MxTiles(kind, bm, bn, bk, split_for(tiles, k, bk, cap), warps, 1 if gemv else 3)


def best_of(cands, run, check) -> tuple[float, object]:
    best = (float("inf"), None)
    for t in dict.fromkeys(cands):
        try:
            if check(t) > 2e-2:
                print(f"  WRONG {t}", file=sys.stderr)
                continue
            best = min(best, (time_us(run(t)), t), key=lambda b: b[0])
        except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory): not a candidate
            print(f"  skip {t}: {type(exc).__name__}", file=sys.stderr)
    return best


def sweep_linear(n: int, k: int, batches, dev, gen) -> None:
    ws = linear_weights(n, k, copies(n * k * MX_BYTES), dev, gen, runtime_copy=False)
    floor_us = n * k * MX_BYTES / peak_bytes_per_s() * 1e6
    for m in batches:
        xs = [torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
        want = F.linear(xs[0].float(), ws[0][2].float())
        def run(t):  # noqa: E306
            return [lambda x=x, w=w: mxfp8_linear(x, w[0], w[1], backend=TRITON, tiles=t) for x, w in zip(xs, ws)]
        check = lambda t: rel_err(mxfp8_linear(xs[0], ws[0][0], ws[0][1], backend=TRITON, tiles=t), want)  # noqa: E731
        rule_us = time_us(run(mx_tiles(m, n, k)))
        us, t = best_of(linear_candidates(m, n, k), run, check)
        print(f"linear N={n} K={k} M={m}: rule {rule_us:6.1f} us ({floor_us / rule_us:4.0%}) best {us:6.1f} us "
              f"({floor_us / us:4.0%}) {t}", flush=True)


def sweep_moe(sh: Shapes, batches, dev, gen) -> None:
    ex = make_experts(sh, dev, gen)
    for (fmt, weights, wbytes), b in itertools.product((("mxfp8", ex.mx, MX_BYTES), ("nvfp4", ex.nv, NV_BYTES)),
                                                      batches):
        rs = [routing(b, sh.n_local, sh, dev, gen) for _ in range(8)]
        hit = sum(int(torch.unique(r["topk_ids"]).numel()) for r in rs) / len(rs)
        floor_us = hit * 3 * sh.inter * sh.hidden * wbytes / peak_bytes_per_s() * 1e6
        deq = weights["scales"].dequantized(weights["w_gate"], weights["w_up"], weights["w_down"], torch.float32)
        x32 = {k: v.float() if v.is_floating_point() else v for k, v in rs[0].items()}
        want = fused_moe_ref(**x32, w_gate=deq[0], w_up=deq[1], w_down=deq[2])
        run = lambda t: [lambda r=r: fused_moe(**r, **weights, backend=TRITON, tiles=t) for r in rs]  # noqa: E731
        check = lambda t: rel_err(fused_moe(**rs[0], **weights, backend=TRITON, tiles=t), want)  # noqa: E731
        rule = quant_moe_tiles(b * sh.top_k, sh.n_local, sh.inter, sh.hidden)
        rule_us = time_us(run(rule))
        cands = [replace(rule, block_n=bn, block_k=bk, num_stages=st, num_warps=nw, split_k=sp)
                 for (bn, nw), bk, st, sp in itertools.product(((64, 4), (128, 8)), (128, 256), (3, 4), (1, 2, 4))
                 if sh.hidden % (sp * bk) == 0]
        us, t = best_of(cands, run, check)
        print(f"moe-local {fmt} B={b}: rule {rule_us:7.1f} us ({floor_us / rule_us:4.0%}) best {us:7.1f} us "
              f"({floor_us / us:4.0%}) {t}", flush=True)


def v1_candidates(rule: MoeTiles):
    """The first generation's tiles around the rule's: BLOCK_N (gate|up, down), stages, warps; BLOCK_M and
    BLOCK_K (128: four E8M0 blocks a step, the most mx_block_steps takes) as the rule has them."""
    yield rule
    for bn, bn_down, st in itertools.product((32, 64, 128), (64, 128), (3, 4)):
        yield replace(rule, block_n=bn, block_n_down=bn_down, num_stages=st, num_warps=8 if bn == 128 else 4)


def sweep_moe_v1(sh: Shapes, batches, dev, gen) -> None:
    ex = make_experts(sh, dev, gen)
    weights = ex.mx
    deq = weights["scales"].dequantized(weights["w_gate"], weights["w_up"], weights["w_down"], torch.float32)
    for (name, n_choice), b in itertools.product((("moe-local", sh.n_local), ("moe-ep", sh.n_routed)), batches):
        rs = [routing(b, n_choice, sh, dev, gen) for _ in range(8)]
        hit = sum(int(torch.unique(r["topk_ids"][r["topk_ids"] >= 0]).numel()) for r in rs) / len(rs)
        floor_us = hit * 3 * sh.inter * sh.hidden * MX_BYTES / peak_bytes_per_s() * 1e6
        x32 = {k: v.float() if v.is_floating_point() else v for k, v in rs[0].items()}
        want = fused_moe_ref(**x32, w_gate=deq[0], w_up=deq[1], w_down=deq[2])
        run = lambda t: [lambda r=r: fused_moe(**r, **weights, backend=TRITON, tiles=t) for r in rs]  # noqa: E731
        check = lambda t: rel_err(fused_moe(**rs[0], **weights, backend=TRITON, tiles=t), want)  # noqa: E731
        bf = ex.bf16
        bf_us = time_us([lambda r=r: fused_moe(**r, **bf, backend=TRITON) for r in rs])
        rule = mx_moe_tiles(b * sh.top_k, sh.n_local, sh.inter, sh.hidden)
        rule_us = time_us(run(rule))
        us, t = best_of(v1_candidates(rule), run, check)
        print(f"{name} mxfp8-v1 B={b}: floor {floor_us:6.1f} bf16 {bf_us:6.1f} | rule {rule_us:7.1f} us "
              f"({floor_us / rule_us:4.0%}) best {us:7.1f} us ({floor_us / us:4.0%}, {bf_us / us:4.2f}x bf16) {t}",
              flush=True)
        bm = block_major_experts(weights)
        bm_check = rel_err(fused_moe(**rs[0], **bm, backend=TRITON, tiles=t), want)
        bm_us = [time_us([lambda r=r: fused_moe(**r, **bm, backend=TRITON, tiles=tt) for r in rs]) for tt in (rule, t)]
        print(f"    block-major: rule {bm_us[0]:7.1f} us ({floor_us / bm_us[0]:4.0%}) best tiles {bm_us[1]:7.1f} us "
              f"({floor_us / bm_us[1]:4.0%}, {bf_us / bm_us[1]:4.2f}x bf16) err {bm_check:.1e}", flush=True)


def sweep_linear_v1(dev, gen) -> None:
    """The first-generation MXFP8 linear (what AUTO runs at 2-32 rows), row-major against block-major weights,
    and bf16 (the skinny kernels at <= 16 rows), at one TP8 rank's shapes."""
    from m3bench.runtime.kernels.mxfp8 import linear_tiles

    for name, n, k in (("qkv+index", 1920, 6144), ("o_proj", 6144, 1024), ("dense gate|up", 3072, 6144)):
        ws = linear_weights(n, k, copies(n * k * MX_BYTES), dev, gen, runtime_copy=False)
        bms = [quant.block_major(w[0]) for w in ws]
        floor_us = n * k * MX_BYTES / peak_bytes_per_s() * 1e6
        for m in (4, 16):
            xs = [torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
            t = linear_tiles(m, n, k)
            want = F.linear(xs[0].float(), ws[0][2].float())
            err = rel_err(mxfp8_linear(xs[0], bms[0], ws[0][1], backend=TRITON, tiles=t), want)
            us = [time_us([lambda x=x, w=w, b=b: f(x, w, b) for x, w, b in zip(xs, ws, bms)]) for f in (
                lambda x, w, b: F.linear(x, w[2]),
                lambda x, w, b: mxfp8_linear(x, w[0], w[1], backend=TRITON, tiles=t),
                lambda x, w, b: mxfp8_linear(x, b, w[1], backend=TRITON, tiles=t))]
            print(f"{name} M={m}: floor {floor_us:5.1f} | bf16 {us[0]:6.1f} | v1 row-major {us[1]:6.1f} "
                  f"({floor_us / us[1]:4.0%}) | block-major {us[2]:6.1f} ({floor_us / us[2]:4.0%}) err {err:.1e}",
                  flush=True)


V1_LINEARS = (("qkv+index", 1920, 6144), ("o_proj", 6144, 1024), ("dense gate|up", 3072, 6144),
              ("shared gate|up", 768, 6144))


def v1_linear_candidates(m: int, n: int, k: int):
    """The first kernel's tiles: BLOCK_N 32 / 64, every split of K into 1-16 pieces of whole 128-steps, 4 stages
    (BLOCK_M the rows padded to 16, BLOCK_K 128, 4 warps: the rule's)."""
    from m3bench.runtime.kernels.mxfp8 import LinearTiles

    steps = k // 128
    for bn, split in itertools.product((32, 64), (1, 2, 3, 4, 6, 8, 12, 16)):
        if steps % split == 0:
            yield LinearTiles(min(64, max(16, next_pow2(m))), bn, 128, 4, 4, split)


def block_major_calls(n: int, k: int, rows, dev, gen):
    """Per row count m of `rows`: (m, run, check) over block-major copies of random MXFP8 weights [n, k] (one copy a
    call, cold): run(tiles) the calls to time, check(tiles) the first call's error against fp32."""
    ws = linear_weights(n, k, copies(n * k * MX_BYTES), dev, gen, runtime_copy=False)
    bms = [(quant.block_major(w[0]), w[1]) for w in ws]
    for m in rows:
        xs = [torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
        want = F.linear(xs[0].float(), ws[0][2].float())
        def run(t, xs=xs):  # noqa: E306
            return [lambda x=x, w=w: mxfp8_linear(x, *w, backend=TRITON, tiles=t) for x, w in zip(xs, bms)]
        def check(t, x=xs[0], want=want):  # noqa: E306
            return rel_err(mxfp8_linear(x, *bms[0], backend=TRITON, tiles=t), want)
        yield m, run, check


def sweep_linear_v1_tiles(dev, gen, batches=(4, 16)) -> None:
    """The first kernel (what AUTO runs at 2-32 rows) on block-major weights: the rule's tiles (linear_tiles)
    against the best candidate, each checked against fp32 first."""
    from m3bench.runtime.kernels.mxfp8 import linear_tiles

    for name, n, k in V1_LINEARS:
        floor_us = n * k * MX_BYTES / peak_bytes_per_s() * 1e6
        for m, run, check in block_major_calls(n, k, batches, dev, gen):
            rule = linear_tiles(m, n, k)
            rule_us = time_us(run(rule))
            us, t = best_of(v1_linear_candidates(m, n, k), run, check)
            print(f"{name} M={m}: floor {floor_us:5.1f} | rule {rule_us:6.1f} us ({floor_us / rule_us:4.0%}) "
                  f"split {rule.split_k} | best {us:6.1f} us ({floor_us / us:4.0%}) {t}", flush=True)


def gemv_candidates(m: int, n: int, k: int):
    """GEMV tiles: (BLOCK_N, BLOCK_K, warps) around the rule's, K split within one wave of 6 (8 warps) or 8 (4 warps)
    programs an SM, each split at least 1 or 2 K steps."""
    for (bn, bk, warps), min_steps in itertools.product(
            ((16, 1024, 8), (16, 512, 4), (16, 512, 8), (16, 256, 4), (32, 512, 4), (64, 256, 4)), (1, 2)):
        bk = block_k_for(k, bk)
        cap = (6 if warps == 8 else 8) * 132
        yield MxTiles(MxKernel.GEMV, next_pow2(m), bn, bk, split_for(-(-n // bn), k, bk, cap, min_steps), warps, 1)


def sweep_gemv_tiles(dev, gen, rows=(1, 2, 4)) -> None:
    """The GEMV on block-major weights at every linear of the rank: the rule's tiles (mx_tiles) against the best
    candidate at one row; at more rows the rule's GEMV tiles against what AUTO runs there (the first kernel)."""
    from m3bench.runtime.kernels.mxfp8 import linear_tiles

    for name, n, k in Shapes().linears:
        floor_us = n * k * MX_BYTES / peak_bytes_per_s() * 1e6
        for m, run, check in block_major_calls(n, k, rows, dev, gen):
            rule = mx_tiles(m, n, k, MxKernel.GEMV)
            rule_us = time_us(run(rule))
            if m == 1:
                us, t = best_of(gemv_candidates(m, n, k), run, check)
            else:
                t = linear_tiles(m, n, k)
                us = time_us(run(t)) if check(t) <= 2e-2 else float("nan")
            print(f"{name} M={m}: floor {floor_us:5.1f} | GEMV rule {rule_us:6.1f} us ({floor_us / rule_us:4.0%}) "
                  f"{rule} | {'best' if m == 1 else 'first kernel'} {us:6.1f} us ({floor_us / us:4.0%}) {t}",
                  flush=True)


def dot_candidates(m: int, n: int, k: int):
    """The dot kernel's tiles at m rows: BLOCK_N 32 / 64 / 128, BLOCK_K 128 / 256, every split of K into 1-16 pieces
    of whole K steps (BLOCK_M the rows padded to 16..64, 3 stages; 8 warps at BLOCK_N 128). At 64 rows a split's
    fp32 partials are 64 x N x 4 bytes: the rule's 3-16 pieces write and read more partial bytes than weight bytes."""
    for bn, bk in itertools.product((32, 64, 128), (128, 256)):
        steps = k // bk if k % bk == 0 else 0
        for split in (1, 2, 3, 4, 6, 8, 12, 16):
            if steps and steps % split == 0:
                yield MxTiles(MxKernel.DOT, min(64, max(16, next_pow2(m))), bn, bk, split, 8 if bn == 128 else 4, 3)


def sweep_dot_tiles(dev, gen, rows=(64,)) -> None:
    """Every linear at `rows` on block-major weights: bf16 (cuBLAS), the rule's kernel and tiles (what AUTO runs),
    the best dot candidate and the best first-kernel candidate, each checked against fp32 first."""
    from m3bench.runtime.kernels.mxfp8 import linear_tiles
    from m3bench.runtime.kernels.quant_kernels import QuantKernels, linear_generation

    for name, n, k in Shapes().linears:
        floor_us = n * k * MX_BYTES / peak_bytes_per_s() * 1e6
        w16 = [torch.randn(n, k, device=dev, generator=gen).to(torch.bfloat16) for _ in range(copies(n * k * 2))]
        for m, run, check in block_major_calls(n, k, rows, dev, gen):
            x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
            bf16_us = time_us([lambda w=w, x=x: F.linear(x, w) for w in w16])
            v1 = linear_generation(m) is QuantKernels.V1
            rule = linear_tiles(m, n, k) if v1 else mx_tiles(m, n, k)
            rule_us = time_us(run(rule))
            dot_us, dot = best_of(dot_candidates(m, n, k), run, check)
            first_us, first = best_of(v1_linear_candidates(m, n, k), run, check)
            print(f"{name} M={m}: floor {floor_us:5.1f} | bf16 {bf16_us:6.1f} | rule {rule_us:6.1f} us "
                  f"({floor_us / rule_us:4.0%}) {rule} | dot {dot_us:6.1f} ({floor_us / dot_us:4.0%}) {dot} | "
                  f"first {first_us:6.1f} ({floor_us / first_us:4.0%}) {first}", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: run on the H200", file=sys.stderr)
        return 2
    part = sys.argv[1] if len(sys.argv) > 1 else "linear"
    parts = ("linear", "moe", "moe-v1", "linear-v1", "linear-v1-tiles", "gemv-tiles", "dot-tiles")
    if part not in parts:
        print(f"unknown part {part!r}: one of {', '.join(parts)}", file=sys.stderr)
        return 2
    dev, gen = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    if part == "linear":
        for n, k in ((1536, 6144), (6144, 1024)):
            sweep_linear(n, k, (1, 4, 16, 64), dev, gen)
    elif part == "moe-v1":
        sweep_moe_v1(Shapes(), (1, 4, 16, 64), dev, gen)
    elif part == "linear-v1":
        sweep_linear_v1(dev, gen)
    elif part == "linear-v1-tiles":
        sweep_linear_v1_tiles(dev, gen)
    elif part == "gemv-tiles":
        sweep_gemv_tiles(dev, gen)
    elif part == "dot-tiles":
        sweep_dot_tiles(dev, gen)
    else:
        sweep_moe(Shapes(), (1, 16, 64), dev, gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
