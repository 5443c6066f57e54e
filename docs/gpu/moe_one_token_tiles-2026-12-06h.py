"""One-off: MXFP8 (and bf16) one-token routed MoE tiles around the rule: down N tile, down K chunks, stages, warps;
gate|up N tile, K chunks. Whole-MoE graph time at 1 and 2 local picks (moe_picks.measure, checked vs fp32)."""
import sys, itertools
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path("benchmarks").resolve())); sys.path.insert(0, str(Path(".").resolve()))
import torch
from moe_picks import formats, measure, B1_MIX
from mxfp8_gpu import Shapes
from floor_bandwidth import use_device_bandwidth
from m3bench.runtime.kernels.moe import first_generation_tiles

dev = torch.device("cuda"); gen = torch.Generator(device=dev).manual_seed(0)
print(use_device_bandwidth(dev), torch.cuda.get_device_name(), flush=True)
sh = Shapes(); fmts = formats(sh, dev, gen)
x = torch.randn(1, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
for ex in fmts[::-1]:
    rule = first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, ex.quantized)
    rows = []
    cands = [rule]
    for bnd, sd, st, w in itertools.product((32, 64, 128), (2, 4, 8), (3, 4, 5), (4, 8)):
        if bnd == 128 and w == 4: continue
        cands.append(replace(rule, block_n_down=bnd, split_down=sd, num_stages=st, num_warps=w))
    for bn, sk in itertools.product((32, 64, 128), (4, 8, 16)):
        if (bn, sk) != (rule.block_n, rule.split_k):
            cands.append(replace(rule, block_n=bn, split_k=sk, split_k_routed=sk, num_warps=8 if bn == 128 else 4))
    for t in cands:
        try:
            us1, f1, e1 = measure(x, ex, t, 1, sh)
        except Exception as e:
            print(ex.label, t, "failed", type(e).__name__, str(e)[:80], flush=True); continue
        if e1 > 2e-2:
            print(ex.label, t, "BAD err", e1, flush=True); continue
        rows.append((us1, t))
        print(f"{ex.label} 1 pick {us1:6.1f} us ({f1 / us1:4.0%}) bn{t.block_n} sk{t.split_k} bnd{t.block_n_down} sd{t.split_down} st{t.num_stages} w{t.num_warps}{' RULE' if t == rule else ''}", flush=True)
    rows.sort(key=lambda r: r[0])
    for us1, t in rows[:5] + [r for r in rows[5:] if r[1] == rule]:
        at = [measure(x, ex, t, n, sh)[0] if n != 1 else us1 for n in range(4)]
        mix = sum(a * b for a, b in zip(B1_MIX, at))
        print(f"{ex.label} BEST " + " ".join(f"{n}:{a:6.1f}" for n, a in enumerate(at)) + f" mix {mix:6.1f} {t}", flush=True)
