"""Paged decode attention at few requests: key step (TILE) x KV segments (split-KV) against the launch rule.

    python benchmarks/attn_segments.py                  # H200: MSA and dense, B 1 / 4, 8k, FP8 KV
    python benchmarks/attn_segments.py --tiny           # CPU smoke run (TRITON_INTERPRET=1)

At batch 1 a TP8 rank's attention reads ~0.5 MB (MSA: 16 selected pages of one KV head): its time is latency,
the serial key steps of a program plus the merge of the segments. This times every (tile, segments) pair as CUDA
graph replays over copies on distinct pages (cold data, kernels_gpu.time_us), the merge kernel included, checks
each output against the rule's (attention.plan_attention), and prints the rule's pick beside the fastest.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_gpu as kg  # noqa: E402

from m3bench.runtime.kernels.attention import paged_attention, plan_attention  # noqa: E402

TILES = (16, 32, 64, 128)  # 16: the tiny run's page
SEGMENTS = (1, 2, 4, 8, 16, 32, 64, 128)


def _attend(pool, bt, sh, sel, out, tile=None, segments=None):
    return paged_attention(bt.q, pool.k, pool.v, bt.block_tables, bt.seq_lens, bt.qsl, sh.d ** -0.5,
                           selected_blocks=sel, out=out, max_query_len=bt.max_q, backend=kg.TRITON,
                           num_segments=segments, tile=tile)


def sweep(sh: kg.Shapes, fmt: str, batch: int, ctx: int, sparse: bool, dev, gen) -> list[dict]:
    """One row per (tile, segments) that the case can run; 'rule' marks attention.plan_attention's choice."""
    nbytes = kg.attn_bytes(fmt, batch, batch, ctx, sh, sparse)
    copies = kg.n_copies(nbytes)
    pool = kg.make_pool(fmt, copies * batch * math.ceil(ctx / sh.page) + 1, sh, dev, gen)
    cases = []
    for _ in range(copies):
        bt = kg.make_batch(pool, [ctx] * batch, [1] * batch, sh, dev, gen)
        sel = kg.run_select(pool, bt, sh) if sparse else None
        cases.append((bt, sel, torch.empty_like(bt.q)))
    bt0, sel0, _ = cases[0]
    rule = plan_attention(bt0.q, pool.k, bt0.block_tables, 1, sel0, None, None)
    want = _attend(pool, bt0, sh, sel0, torch.empty_like(bt0.q))
    iters = (sh.topk * sh.page) if sparse else ctx
    rows = []
    for tile in (t for t in TILES if t <= sh.page and (t > 16 or sh.page == 16)):
        for seg in (s for s in SEGMENTS if s <= max(1, iters // tile)):
            got = _attend(pool, bt0, sh, sel0, torch.empty_like(bt0.q), tile, seg)
            err = kg.rel_err(got, want)
            calls = [lambda c=c, t=tile, s=seg: _attend(pool, c[0], sh, c[1], c[2], t, s) for c in cases]
            rows.append({"kind": "msa" if sparse else "dense", "batch": batch, "ctx": ctx, "tile": tile,
                         "segments": seg, "us": kg.time_us(calls), "err": err,
                         "rule": (tile, seg) == (rule.tile, rule.n_seg)})
    return rows


def print_rows(rows: list[dict]) -> bool:
    ok = True
    print(f"{'kind':>5} {'B':>3} {'ctx':>6} {'tile':>5} {'segs':>5} {'us':>8} {'err':>9}")
    for r in rows:
        mark = " <- rule" if r["rule"] else ""
        print(f"{r['kind']:>5} {r['batch']:>3} {r['ctx']:>6} {r['tile']:>5} {r['segments']:>5} {r['us']:>8.2f} "
              f"{r['err']:>9.2e}{mark}")
        ok &= r["err"] < 2e-2
    for key in sorted({(r["kind"], r["batch"]) for r in rows}):
        case = [r for r in rows if (r["kind"], r["batch"]) == key]
        best, rule = min(case, key=lambda r: r["us"]), next((r for r in case if r["rule"]), None)
        told = f"rule tile {rule['tile']} x {rule['segments']} segs {rule['us']:.2f} us" if rule else "rule not swept"
        print(f"{key[0]} B={key[1]}: best tile {best['tile']} x {best['segments']} segs {best['us']:.2f} us; {told}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--fmt", default="fp8")
    args = p.parse_args(argv)
    sh = kg.TINY if args.tiny else kg.Shapes()
    dev = torch.device("cpu" if args.tiny else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ctx = min(args.ctx, max(sh.contexts)) if args.tiny else args.ctx
    rows = [r for b in args.batches for sparse in (True, False) for r in sweep(sh, args.fmt, b, ctx, sparse, dev, gen)]
    ok = print_rows(rows)
    print("every output within 2e-2 of the rule's" if ok else "SOME OUTPUT DIFFERS from the rule's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
