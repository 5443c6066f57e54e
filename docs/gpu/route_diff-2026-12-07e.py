"""Where the routing in the gate|up launch differs from the router's launch on the GPU: weights (max |diff|, ulps),
ids, outputs; the GEMVs (MXFP8) and the split tiles (bf16)."""
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, first_generation_tiles, fused_moe, gemv_tiles
from m3bench.runtime.kernels.router import KernelRoute, router_topk_align, routing_outputs

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
E, N_LOCAL, FIRST, H, I = 128, 16, 16, 6144, 3072
q = [quant.quant_mxfp8(torch.randn(N_LOCAL, r, c, device=dev, generator=g) * 0.05) for r, c in ((2 * I, H), (H, I))]
mx = (quant.block_major(q[0][0])[:, :I], quant.block_major(q[0][0])[:, I:], quant.block_major(q[1][0]),
      MoeScales(q[0][1][:, :I], q[0][1][:, I:], q[1][1]), gemv_tiles(I, H))
bf = torch.randn(N_LOCAL, 2 * I, H, device=dev, generator=g).to(torch.bfloat16) * 0.05
bd = torch.randn(N_LOCAL, H, I, device=dev, generator=g).to(torch.bfloat16) * 0.05
plain = (bf[:, :I], bf[:, I:], bd, None, first_generation_tiles(1, 4, N_LOCAL, I, H, False))
bias = torch.randn(E, device=dev, generator=g) * 0.01
for name, (wg, wu, wd, scales, tiles) in (("gemv-mxfp8", mx), ("split-bf16", plain)):
    for local in range(5):
        for seed in range(3):
            gg = torch.Generator(device=dev).manual_seed(100 * local + seed)
            logits = torch.randn(1, E, device=dev, generator=gg) - 4
            mine = FIRST + torch.randperm(N_LOCAL, device=dev, generator=gg)[:local]
            others = torch.tensor([e for e in range(E) if not FIRST <= e < FIRST + N_LOCAL], device=dev)
            others = others[torch.randperm(len(others), device=dev, generator=gg)[:4 - local]]
            logits[0, torch.cat([mine, others])] = 3 + torch.rand(4, device=dev, generator=gg)
            x = torch.randn(1, H, device=dev, generator=gg).to(torch.bfloat16)
            w0, ids0, al0 = router_topk_align(logits, bias, 4, 2.5, FIRST, N_LOCAL, tiles.block_m, False)
            kw = {} if tiles.gemv else {"alignment": al0}
            y0 = fused_moe(x, wg, wu, wd, ids0, w0, backend=KernelBackend.TRITON, tiles=tiles, scales=scales, **kw)
            w1, ids1, al1 = routing_outputs(1, 4, N_LOCAL, tiles.block_m, False, dev)
            kw = {} if tiles.gemv else {"alignment": al1}
            y1 = fused_moe(x, wg, wu, wd, ids1, w1, backend=KernelBackend.TRITON, tiles=tiles, scales=scales,
                           route=KernelRoute(logits, bias, 2.5, FIRST), **kw)
            s = torch.sigmoid(logits.double())[0, (ids0[0] + FIRST).clamp(0, E - 1)]
            ref = (s / s.sum() * 2.5).float()
            print(f"{name} local {local} seed {seed}: ids {torch.equal(ids0, ids1)} w {torch.equal(w0, w1)} "
                  f"dw {float((w0 - w1).abs().max()):.2e} w0-ref {float((w0[0] - ref).abs().max()):.2e} "
                  f"w1-ref {float((w1[0] - ref).abs().max()):.2e} y {torch.equal(y0, y1)} "
                  f"dy {float((y0.float() - y1.float()).abs().max()):.3e}")
