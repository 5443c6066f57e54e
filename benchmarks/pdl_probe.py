"""Programmatic dependent launch (PDL) on the H200, inside a CUDA graph: what it saves per launch.

    python benchmarks/pdl_probe.py            # H200, ~20 s

A chain of dependent GEMVs (y_i = W_i x_i, x_{i+1} = y_i, each launch on its own weight copy) captured in one
CUDA graph, timed per launch for: plain launches; PDL with the trigger after the wait ("late"); PDL with the
trigger before the wait ("early": the next launch may start while this one runs); early + each program
prefetching its weight rows into L2 (cp.async.bulk.prefetch.L2) before it waits. Tiny GEMVs show the launch
gap alone; a few-MB GEMV shows what the prefetch adds. Every mode's output is checked against torch.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl


@triton.jit
def prefetch_rows(rows, nbytes):
    """Bulk-prefetch nbytes (a multiple of 16) from each row start (16-byte aligned) into L2; no data returned."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [rows, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, scale, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr, PREFETCH: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + n.to(tl.int64) * K
    if PREFETCH:
        prefetch_rows(rows, K * 2)
    if PDL and EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:
        tl.extra.cuda.gdc_wait()
    if PDL and not EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(rows[:, None] + kk[None, :]).to(tl.float32)
        x = tl.load(x_ptr + kk).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(y_ptr + n, (acc * scale).to(tl.bfloat16))


MODES = {"plain": (False, False, False), "pdl-late": (True, False, False), "pdl-early": (True, True, False),
         "pdl-early+prefetch": (True, True, True)}


def chain(xs, ws, modes, block_n):
    n, k = ws[0].shape
    pdl, early, pre = modes
    for i, w in enumerate(ws):
        gemv_kernel[(n // block_n,)](xs[i], w, xs[i + 1], k ** -0.5, N=n, K=k, BLOCK_N=block_n, BLOCK_K=min(k, 256),
                                     PDL=pdl, EARLY=early, PREFETCH=pre, launch_pdl=pdl, num_warps=4)


def run(n: int, launches: int, block_n: int) -> list[tuple[str, float, float]]:
    g = torch.Generator(device="cuda").manual_seed(n)
    ws = [torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16) for _ in range(launches)]
    x0 = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    want = x0.float()
    for w in ws:
        want = (w.float() @ want * n ** -0.5).to(torch.bfloat16).float()
    rows = []
    for name, modes in MODES.items():
        xs = [x0.clone()] + [torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in ws]
        chain(xs, ws, modes, block_n)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(xs, ws, modes, block_n)
        for x in xs[1:]:
            x.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = ((xs[-1].float() - want).norm() / want.norm()).item()
        times = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / launches)
        times.sort()
        rows.append((name, times[len(times) // 2], err))
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("pdl_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    ok = True
    print(f"{'n x n':>12} {'MB':>6} {'mode':>20} {'us/launch':>10} {'rel err':>9}")
    for n, launches, block_n in ((256, 64, 16), (2048, 16, 16), (4096, 8, 32)):
        for name, us, err in run(n, launches, block_n):
            ok &= err < 2e-2
            print(f"{n:>5} x {n:<5} {n * n * 2 / 1e6:6.1f} {name:>20} {us:10.2f} {err:9.1e}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
