"""GPU check at a TP8/EP8 rank's MXFP8 expert shapes: the GEMVs routing in their gate|up launch against the router's
launch + the same GEMVs (weights, local ids, output bits), 0-4 local picks, with the correction bias."""
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, fused_moe, gemv_tiles
from m3bench.runtime.kernels.router import KernelRoute, router_topk_align, routing_outputs

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
E, N_LOCAL, FIRST, H, I = 128, 16, 16, 6144, 3072
q = [quant.quant_mxfp8(torch.randn(N_LOCAL, r, c, device=dev, generator=g) * 0.05) for r, c in ((2 * I, H), (H, I))]
wgu, wd = quant.block_major(q[0][0]), quant.block_major(q[1][0])
scales = MoeScales(q[0][1][:, :I], q[0][1][:, I:], q[1][1])
wg, wu = wgu[:, :I], wgu[:, I:]
tiles = gemv_tiles(I, H)
bias = torch.randn(E, device=dev, generator=g) * 0.01
ok = True
for local in range(5):
    for seed in range(3):
        gg = torch.Generator(device=dev).manual_seed(100 * local + seed)
        logits = torch.randn(1, E, device=dev, generator=gg) - 4
        mine = FIRST + torch.randperm(N_LOCAL, device=dev, generator=gg)[:local]
        others = torch.tensor([e for e in range(E) if not FIRST <= e < FIRST + N_LOCAL], device=dev)
        others = others[torch.randperm(len(others), device=dev, generator=gg)[:4 - local]]
        logits[0, torch.cat([mine, others])] = 3 + torch.rand(4, device=dev, generator=gg)
        x = torch.randn(1, H, device=dev, generator=gg).to(torch.bfloat16)
        w0, ids0, _ = router_topk_align(logits, bias, 4, 2.5, FIRST, N_LOCAL, tiles.block_m, False)
        y0 = fused_moe(x, wg, wu, wd, ids0, w0, backend=KernelBackend.TRITON, tiles=tiles, scales=scales)
        w1, ids1, _ = routing_outputs(1, 4, N_LOCAL, tiles.block_m, False, dev)
        y1 = fused_moe(x, wg, wu, wd, ids1, w1, backend=KernelBackend.TRITON, tiles=tiles, scales=scales,
                       route=KernelRoute(logits, bias, 2.5, FIRST))
        n_local = int(((ids1 >= 0) & (ids1 < N_LOCAL)).sum())
        same = torch.equal(w1, w0) and torch.equal(ids1, ids0) and torch.equal(y1, y0) and n_local == local
        ok &= same and bool(torch.isfinite(y1.float()).all())
        print(f"local {local} seed {seed}: picks {n_local} same {same} |y| {float(y1.float().abs().max()):.3f}")
print("GEMV ROUTE CHECK", "ok" if ok else "FAILED")
