"""One-off record (H100, 2026-12-06, docs/performance.md 9f): the MXFP8 GEMV as it was ("runtime mx", tree of 1b6d75b)
against the prototype reading its inputs once (gemv_proto-2026-12-06f.py, now the runtime's kernel) and read-only
kernels, at the rank's linear shapes. Run from the repo root: PYTHONPATH=. python3 docs/gpu/gemv_x_once_read-2026-12-06f.py 1 4
(on a later tree "runtime mx" is the new kernel)."""
import math, sys, itertools
sys.path.insert(0, "benchmarks")
import torch, torch.nn.functional as F
from kernels_gpu import time_us
from floor_bandwidth import use_device_bandwidth
from decode_floor import peak_bytes_per_s
from read_ceiling import read
import importlib.util, pathlib
_spec = importlib.util.spec_from_file_location("gemv_proto", pathlib.Path(__file__).with_name("gemv_proto-2026-12-06f.py"))
gp = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(gp)
from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import pdl_args
from m3bench.runtime.kernels.mx_linear import mx_linear, mx_tiles, split_for, split_counters
from m3bench.runtime.kernels.mxfp8 import mxfp8_linear, linear_tiles

dev = torch.device("cuda")
print(use_device_bandwidth(dev))
gen = torch.Generator(device=dev).manual_seed(0)
SHAPES = [("qkv+index", 1920, 6144), ("o_proj", 6144, 1024), ("dense gate|up", 3072, 6144),
          ("dense down", 6144, 1536), ("shared gate|up", 768, 6144), ("shared down", 6144, 384)]
rows_arg = [int(a) for a in sys.argv[1:]] or [1]

def gemv_a(x, w, s, bn, bk, split, warps, variant=0):
    n, k = w.shape
    y = x.new_empty((1, n)); parts = torch.empty((split, 1, n), device=x.device)
    gp.gemv_a_kernel[(math.ceil(n / bn), split)](x, w, s.view(torch.uint8), y, y, parts, split_counters(x.device), 1,
        x.stride(0), w.stride(0), 32, s.stride(0), y.stride(0), 0, N=n, K=k, K_SPLIT=k // split, SPLIT=split,
        BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=False, SCALED=True, EVEN=True, VARIANT=variant,
        num_warps=warps, num_stages=1, **pdl_args(x))
    return y

def read_tile(w, out, bn, bk, split, warps):
    n, k = w.shape
    wi = w.view(torch.int32)
    gp.read_tile_kernel[(math.ceil(n / bn), split)](wi, out, wi.stride(0), N=n, K_SPLIT_W=k // 4 // split,
        BLOCK_N=bn, BLOCK_W=bk // 4, num_warps=warps, **pdl_args(w))

def read_flat(w, out, progs, bw, warps):
    # the run of the log had this kernel here with WORDS / CHUNK constexpr; the same reads as read_ceiling.read
    read(w.view(torch.int32).reshape(-1), out, progs, bw, warps)

for name, n, k in SHAPES:
    nbytes = n * k * (1 + 1 / 32)
    cnt = max(4, min(64, math.ceil(150e6 / nbytes)))
    ws = []
    for _ in range(cnt):
        w, s = quant.quant_mxfp8(torch.randn(n, k, device=dev, generator=gen) * k ** -0.5)
        ws.append((w, s))
    wb = [quant.dequant_mxfp8(w, s, torch.bfloat16) for w, s in ws[:max(4, min(64, math.ceil(150e6 / (2 * n * k))))]]
    floor_us = nbytes / peak_bytes_per_s() * 1e6
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    for m in rows_arg:
        xs = [torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
        res = {}
        res["bf16 cublas"] = time_us([lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, wb)]) * 1.0
        res["runtime mx"] = time_us([lambda x=x, w=w: mxfp8_linear(x, w[0], w[1]) for x, w in zip(xs, ws)])
        want = F.linear(xs[0].float(), quant.dequant_mxfp8(ws[0][0], ws[0][1], torch.float32))
        if m == 1:
            t = mx_tiles(1, n, k)
            res[f"read tile grid (gemv {t.block_n}x{t.block_k} s{t.split_k})"] = time_us(
                [lambda w=w: read_tile(w[0], out, t.block_n, t.block_k, t.split_k, t.num_warps) for w in ws])
            for bn, bk, warps, per_sm in [(16, 1024, 8, 6), (16, 512, 4, 8), (32, 512, 4, 6), (32, 256, 4, 8),
                                           (64, 256, 4, 4), (64, 256, 8, 4), (16, 256, 4, 8), (32, 1024, 8, 4)]:
                if k % bk:
                    continue
                split = split_for(math.ceil(n / bn), k, bk, per_sm * 132)
                f = lambda x, w: gemv_a(x, w[0], w[1], bn, bk, split, warps)
                err = ((f(xs[0], ws[0]).float() - want).abs().max() / want.abs().max()).item()
                res[f"gemv_a {bn}x{bk} w{warps} s{split} err {err:.1e}"] = time_us([lambda x=x, w=w, f=f: f(x, w) for x, w in zip(xs, ws)])
        for progs, bw, warps in [(132, 2048, 8), (264, 1024, 4), (528, 1024, 4), (1056, 512, 4), (264, 2048, 8), (528, 2048, 8)]:
            res[f"read flat p{progs} bw{bw} w{warps}"] = time_us([lambda w=w: read_flat(w[0], out, progs, bw, warps) for w in ws])
        print(f"\n{name} {n}x{k} rows {m}: floor {floor_us:.2f} us (MXFP8 bytes), bf16 floor {2*n*k/peak_bytes_per_s()*1e6:.2f}")
        for key, us in res.items():
            print(f"  {key:55s} {us:7.2f} us  {100*floor_us/us:5.1f}% of MX floor")
    del ws, wb
    torch.cuda.empty_cache()
