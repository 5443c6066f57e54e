"""The fused tails on the GPU at a rank's shapes (4 index heads, 1 KV head, page 128, top-16), against the unfused:
the MSA top-k selected by the last block-scores program (kernels.msa_index.FUSE_TOPK) and the attention's split
merged by its last segment program (kernels.attention.MERGE_SEGMENTS), us per call (CUDA graph over cold copies),
the same selection / output within 1e-2, the split counters left zero.

    python3 benchmarks/fused_tails.py
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_gpu as kg  # noqa: E402
from m3bench.runtime.kernels import attention, msa_index  # noqa: E402
from m3bench.runtime.kernels.msa_index import msa_select_blocks  # noqa: E402
from m3bench.runtime.kernels.mx_linear import split_counters  # noqa: E402

dev = torch.device("cuda"); gen = torch.Generator(device=dev).manual_seed(0)
sh = kg.Shapes()
HI = 4
ok = True
print(f"{'what':>6} {'fmt':>5} {'B':>3} {'q':>2} {'ctx':>6} {'off us':>8} {'on us':>8} {'same/err':>10}")
for fmt in ("fp8", "nvfp4"):
    for batch, q_len in ((1, 1), (4, 1), (16, 1), (64, 1), (4, 4)):
        for ctx in (8192, 32768, 131072):
            if batch * ctx > 64 * 32768:
                continue
            nbytes = kg.attn_bytes(fmt, batch, batch * q_len, ctx, sh, True)
            copies = kg.n_copies(nbytes)
            pool = kg.make_pool(fmt, copies * batch * math.ceil(ctx / sh.page) + 1, sh, dev, gen)
            cases = []
            for _ in range(copies):
                bt = kg.make_batch(pool, [ctx] * batch, [q_len] * batch, sh, dev, gen)
                iq = torch.randn(bt.q.shape[0], HI, sh.di, device=dev, generator=gen, dtype=torch.bfloat16)
                cases.append((bt, iq))
            def sel_of(c, out=None):
                bt, iq = c
                return msa_select_blocks(iq, pool.ik, bt.block_tables, bt.seq_lens, bt.qsl, sh.topk, out=out,
                                         max_query_len=bt.max_q, backend=kg.TRITON)
            res = {}
            for f in (0, 1):
                msa_index.FUSE_TOPK = f
                outs = [sel_of(c) for c in cases]
                first = sel_of(cases[0])
                res[f] = (first, kg.time_us([lambda c=c, o=o: sel_of(c, o) for c, o in zip(cases, outs)]),
                          torch.equal(sel_of(cases[0]), first))
            msa_index.FUSE_TOPK = 0
            same = torch.equal(res[0][0], res[1][0]) and res[1][2] and not split_counters(dev).any()
            ok &= same
            print(f"{'topk':>6} {fmt:>5} {batch:>3} {q_len:>2} {ctx:>6} {res[0][1]:8.2f} {res[1][1]:8.2f} {str(same):>10}")
            # attention on the selection (MSA): reduce launch vs merged in the launch
            sels = [sel_of(c)[:, :1].contiguous() for c in cases]  # KV head 0's picks (one KV head a rank)
            def attn(c, s, out):
                bt, _ = c
                return kg.run_attention(pool, bt, sh, sel=s, out=out)
            ares = {}
            for m in (0, 1):
                attention.MERGE_SEGMENTS = m
                outs = [torch.empty_like(c[0].q) for c in cases]
                first = attn(cases[0], sels[0], torch.empty_like(cases[0][0].q))
                ares[m] = (first, kg.time_us([lambda c=c, s=s, o=o: attn(c, s, o) for c, s, o in zip(cases, sels, outs)]),
                           torch.equal(attn(cases[0], sels[0], torch.empty_like(first)), first))
            attention.MERGE_SEGMENTS = 0
            err = kg.rel_err(ares[1][0], ares[0][0])
            good = err < 1e-2 and ares[1][2] and not split_counters(dev).any()
            ok &= good
            print(f"{'attn':>6} {fmt:>5} {batch:>3} {q_len:>2} {ctx:>6} {ares[0][1]:8.2f} {ares[1][1]:8.2f} {err:10.2e}{'' if good else ' BAD'}")
print("ALL OK" if ok else "SOME DIFFER")
