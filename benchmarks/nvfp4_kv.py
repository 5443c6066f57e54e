"""NVFP4 against FP8 KV at long context: the decode attention kernels of one TP8 rank (8 query heads,
1 KV head of 128, index head of 128, page = block = 128, top-16) at batch 32, contexts 32k and 128k.

    python benchmarks/nvfp4_kv.py                      # H200, ~1-2 min: checks, then the table
    TRITON_INTERPRET=1 python benchmarks/nvfp4_kv.py --tiny   # CPU smoke run, tiny shapes

Each KV format as the runtime stores it (KVDtype.FP8 / NVFP4): K, V and the index keys in that format;
NVFP4 twice: the PTX decode (the default on CUDA) and Triton's fp8 conversion (`nvfp4-cvt`).
Rows: dense paged attention (the 3 dense layers), the MSA indexer (block scores + top-k) and MSA
attention over the 16 selected blocks (the other 57 layers); per context a decode-step estimate of
attention alone, 3 x dense + 57 x (index + MSA attention), and its NVFP4 / FP8 ratio (issue 12's goal:
<= 1.1). Timing as benchmarks/kernels_gpu.py: median over CUDA-graph replays of calls on distinct
inputs (cold L2). Before the timings every kernel is checked against its torch reference at these
shapes (2 requests). Exit code: 0 checks passed, 1 a check failed, 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # kernels_gpu

import torch
from kernels_gpu import (
    TINY,
    Pool,
    Shapes,
    Timing,
    attn_bytes,
    attn_call,
    check_attention,
    check_select,
    check_sparse,
    kv_bytes_per_token,
    make_batch,
    n_copies,
    select_call,
    store_as,
    time_us,
)

from m3bench.runtime.kernels.backend import NVFP4_DECODE, Nvfp4Decode

FORMATS = ("fp8", "nvfp4")
VARIANTS = (("fp8", "fp8", None), ("nvfp4", "nvfp4", "asm"), ("nvfp4-cvt", "nvfp4", "cvt"))  # (label, pool, decode)
DENSE_LAYERS, MSA_LAYERS = 3, 57  # MiniMax-M3's 60 layers
GOAL_RATIO = 1.1


@dataclass(frozen=True)
class Plan:
    shapes: Shapes
    batch: int
    contexts: tuple[int, ...]


def make_plan(tiny: bool) -> Plan:
    if tiny:
        return Plan(replace(TINY, batches=(2,), contexts=(40, 100)), 2, (40, 100))
    return Plan(Shapes(), 32, (32768, 131072))


def make_pool(fmt: str, n_pages: int, sh: Shapes, dev, gen) -> Pool:
    """K, V and index keys all in fmt (as KVCache keeps an MSA layer under that KVDtype)."""
    def rnd(*s):
        return torch.randn(*s, device=dev, generator=gen, dtype=torch.bfloat16)
    k = store_as(rnd(n_pages, sh.hkv, sh.page, sh.d), fmt)
    v = store_as(rnd(n_pages, sh.hkv, sh.page, sh.d), fmt)
    return Pool(k, v, store_as(rnd(n_pages, sh.page, sh.di), fmt), n_pages)


def index_bytes(fmt: str, n_req: int, ctx: int, sh: Shapes) -> int:
    """Every index key of the context (in fmt), the block scores written and read back, iq."""
    keys = n_req * ctx * kv_bytes_per_token(fmt, sh.di)
    return int(keys + 2 * n_req * sh.hkv * math.ceil(ctx / sh.page) * 4 + n_req * sh.hkv * sh.di * 2)


def timings(pool: Pool, fmt: str, label: str, plan: Plan, dev, gen) -> list[Timing]:
    sh, b, out = plan.shapes, plan.batch, []
    for ctx in plan.contexts:
        seq, q = [ctx] * b, [1] * b
        for kernel, nbytes, make in (
            ("attn", attn_bytes(fmt, b, b, ctx, sh, False), lambda: attn_call(pool, sh, seq, q, dev, gen)),
            ("msa-index", index_bytes(fmt, b, ctx, sh), lambda: select_call(pool, sh, seq, q, dev, gen)),
            ("msa-attn", attn_bytes(fmt, b, b, ctx, sh, True),
             lambda: attn_call(pool, sh, seq, q, dev, gen, sparse=True)),
        ):
            out.append(Timing(kernel, label, b, ctx, 1, time_us([make() for _ in range(n_copies(nbytes))]), nbytes))
            print(f"  {kernel} {label} B{b} ctx{ctx}: {out[-1].us:.1f} us", file=sys.stderr, flush=True)
    return out


def checks(pool: Pool, label: str, sh: Shapes, ctx: int, dev, gen) -> list:
    bt = make_batch(pool, [ctx, ctx // 3 + 5], [1, 1], sh, dev, gen)
    return [check_attention(pool, bt, sh, label), check_select(pool, bt, sh, label), check_sparse(pool, bt, sh, label)]


def step_us(rows: list[Timing], fmt: str, ctx: int) -> float:
    """Attention of one decode step: the dense layers' paged attention, the MSA layers' index + attention."""
    us = {r.kernel: r.us for r in rows if r.fmt == fmt and r.ctx == ctx}
    return DENSE_LAYERS * us["attn"] + MSA_LAYERS * (us["msa-index"] + us["msa-attn"])


def table(rows: list[Timing], plan: Plan, device: str) -> str:
    labels = [v[0] for v in VARIANTS]
    lines = [f"NVFP4 vs FP8 KV decode attention, one TP8 rank (8 q heads, 1 KV head of 128, index head 128, "
             f"page 128, top-16), batch {plan.batch}, {device}; nvfp4 = the PTX decode (kv_tiles_triton."
             f"nvfp4_to_f16_asm), nvfp4-cvt = Triton's fp8 conversion; ratio = over fp8",
             f"{'kernel':10} {'ctx':>7} " + " ".join(f"{lb + ' us':>13}" for lb in labels)
             + " " + " ".join(f"{lb + ' ratio':>16}" for lb in labels[1:]) + f" {'fp8 %4.3':>9}"]
    by = {(r.kernel, r.fmt, r.ctx): r for r in rows}
    for ctx in plan.contexts:
        for kernel in ("attn", "msa-index", "msa-attn"):
            got = [by.get((kernel, lb, ctx)) for lb in labels]
            if any(g is None for g in got):
                continue
            lines.append(f"{kernel:10} {ctx:7d} " + " ".join(f"{g.us:13.1f}" for g in got) + " "
                         + " ".join(f"{g.us / got[0].us:16.2f}" for g in got[1:]) + f" {got[0].pct_peak:9.1f}")
    for ctx in plan.contexts:
        f8 = step_us(rows, "fp8", ctx)
        for lb in labels[1:]:
            f4 = step_us(rows, lb, ctx)
            verdict = "met" if f4 / f8 <= GOAL_RATIO else "NOT met"
            lines.append(f"step attention ({DENSE_LAYERS} dense + {MSA_LAYERS} MSA layers) ctx {ctx}: fp8 "
                         f"{f8 / 1e3:.3f} ms, {lb} {f4 / 1e3:.3f} ms, ratio {f4 / f8:.2f} (goal <= {GOAL_RATIO}: "
                         f"{verdict})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("no CUDA device: run with --tiny (and TRITON_INTERPRET=1) for a CPU smoke run", file=sys.stderr)
        return 2
    plan, t0 = make_plan(args.tiny), time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    n_pages = plan.batch * math.ceil(max(plan.contexts) / plan.shapes.page) + 8
    rows, results, chosen = [], [], NVFP4_DECODE["decode"]
    for fmt in FORMATS:
        pool = make_pool(fmt, n_pages, plan.shapes, dev, gen)
        for label, _, decode in (v for v in VARIANTS if v[1] == fmt):
            if decode is not None:
                NVFP4_DECODE["decode"] = Nvfp4Decode(decode)
            results += checks(pool, label, plan.shapes, min(plan.contexts), dev, gen)
            rows += timings(pool, fmt, label, plan, dev, gen)
        NVFP4_DECODE["decode"] = chosen
        del pool
    for c in results:
        print(f"check {c.name}: rel err {c.err:.2e} (tol {c.tol:.0e}) {'ok' if c.ok else 'FAILED'}")
    device = torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)"
    print(table(rows, plan, device))
    print(f"[{time.perf_counter() - t0:.0f} s]")
    return 0 if all(c.ok for c in results) else 1


if __name__ == "__main__":
    if "--tiny" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
