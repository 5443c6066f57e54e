"""One-off: the one-token routed MoE (decode step's tiles) by kernel, eager under the profiler, 0-2 local picks,
bf16 and MXFP8 block-major; each kernel's device us (mean over calls with cold experts) against its bytes' floor
and the read ceiling of those bytes."""
import sys, collections
from pathlib import Path
sys.path.insert(0, str(Path("benchmarks").resolve())); sys.path.insert(0, str(Path(".").resolve()))
import torch
from torch.profiler import profile, ProfilerActivity
from moe_picks import formats, picks, CALLS, TRITON
from mxfp8_gpu import Shapes
from floor_bandwidth import use_device_bandwidth
from decode_floor import peak_bytes_per_s
from read_ceiling import read_us
from m3bench.runtime.kernels.moe import first_generation_tiles, fused_moe

dev = torch.device("cuda"); gen = torch.Generator(device=dev).manual_seed(0)
print(use_device_bandwidth(dev), torch.cuda.get_device_name())
sh = Shapes(); fmts = formats(sh, dev, gen)
x = torch.randn(1, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
for ex in fmts:
    tiles = first_generation_tiles(1, sh.top_k, sh.n_local, sh.inter, sh.hidden, ex.quantized)
    gu_b = 2 * sh.inter * sh.hidden * ex.bytes_per_weight; dn_b = sh.inter * sh.hidden * ex.bytes_per_weight
    print(ex.label, tiles, "read ceiling gate|up %.1f us, down %.1f us" % (read_us(int(gu_b), dev)[0], read_us(int(dn_b), dev)[0]))
    for n_local in (0, 1, 2):
        rs = [picks(n_local, c, sh, dev) for c in range(CALLS)]
        for r in rs: fused_moe(x, **r, **ex.weights, backend=TRITON, tiles=tiles)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                for r in rs: fused_moe(x, **r, **ex.weights, backend=TRITON, tiles=tiles)
            torch.cuda.synchronize()
        agg = collections.defaultdict(lambda: [0.0, 0])
        for e in prof.events():
            if e.device_type.name == "CUDA":
                agg[e.name][0] += e.device_time; agg[e.name][1] += 1
        n = 3 * CALLS
        fl = {"gate_up": n_local * gu_b, "down": n_local * dn_b}
        tot = 0.0
        for name, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
            us = t / n; tot += us
            key = "gate_up" if "gate_up" in name else "down" if "down" in name else None
            f = fl.get(key, 0) / peak_bytes_per_s() * 1e6 if key else 0
            print(f"  {ex.label} picks {n_local} {name[:40]:<40} {c / n:4.1f}x {us:7.2f} us" + (f"  floor {f:6.2f} ({f / us:4.0%})" if f else ""))
        print(f"  {ex.label} picks {n_local} sum of kernels {tot:7.2f} us")

# peers: cuBLAS at one row over one expert's bf16 weights (gate|up as one [2I, H] matrix, down [H, I]), cold
from kernels_gpu import time_us
bf = fmts[0].weights
gu = [torch.cat([bf["w_gate"][e], bf["w_up"][e]], 0) for e in range(8)]
dn = [bf["w_down"][e].contiguous() for e in range(8)]
h = torch.randn(1, sh.inter, device=dev, dtype=torch.bfloat16)
for name, ws, a in (("gate|up", gu, x), ("down", dn, h)):
    us = time_us([lambda w=w: a @ w.t() for w in ws])
    f = ws[0].numel() * 2 / peak_bytes_per_s() * 1e6
    print(f"cuBLAS bf16 one row {name}: {us:.2f} us, floor {f:.2f} ({f / us:.0%})")
