"""The few-row decode GEMMs over plain weights (kernels/skinny.py) against cuBLAS at one TP8 rank's shapes.

    python benchmarks/skinny_gemm.py                 # H200: the rule's tiles and cuBLAS, < 1 min
    python benchmarks/skinny_gemm.py --sweep         # + a tile sweep per shape (each candidate checked first)
    TRITON_INTERPRET=1 python benchmarks/skinny_gemm.py --tiny    # CPU smoke run

Rows: qkv + index (q 8 heads, k and v one head each, index q 4 heads, index k), o_proj, the dense MLP, the
shared expert (bf16) and the router (fp32 weights and input, to 4 rows) of one TP8/EP8 rank, at 1, 4 and 16
rows; "+act" rows: gate|up with the activation in the epilogue against cuBLAS + the gated_act kernel; "+add":
the down GEMM adding a [rows, N] tensor against cuBLAS + an add. Every
call reads its own weight copy (> 150 MB a graph replay), as a decode step does across layers. % of floor:
the weight bytes at the floor's bandwidth (decode_floor.peak_bytes_per_s: the device's copy rate, measured at the
start) against the time. Error: max
|got - want| / max |want| against fp32 matmul. Exit code: 0 every error below 2e-2, 1 one is not (or a
kernel failed), 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth
from mxfp8_gpu import rel_err
from mxfp8_speed import copies, error_of, measure

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.gated_act import gated_act
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles, block_k_for, split_for
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.kernels.skinny import GEMV_MAX_ROWS, Gate, skinny_linear, skinny_tiles
from m3bench.runtime.layers.activation import gated_activation

MAX_ERR = 2e-2
SMS = 132
SHAPES = (("qkv+index", 1920, 6144, torch.bfloat16), ("o_proj", 6144, 1024, torch.bfloat16),
          ("dense gate|up", 3072, 6144, torch.bfloat16), ("dense down", 6144, 1536, torch.bfloat16),
          ("shared gate|up", 768, 6144, torch.bfloat16), ("shared down", 6144, 384, torch.bfloat16),
          ("router", 128, 6144, torch.float32))
TINY = (("qkv", 96, 256, torch.bfloat16), ("router", 16, 256, torch.float32))
FUSED = (("shared gate|up+act", 768, 6144), ("dense gate|up+act", 3072, 6144), ("shared down+add", 6144, 384))
TINY_FUSED = (("gate|up+act", 64, 256), ("down+add", 64, 128))
GATE = Gate(MoeActivation.SWIGLUOAI, 1.702, 7.0)
ROWS = (1, 4, 16)
# dot candidates: (BLOCK_N, BLOCK_K, stages, warps); GEMV: (BLOCK_N, BLOCK_K, warps, stages); each with K whole
# (0) or split to 1, 2, 4 programs an SM. BLOCK_N 16 (the MMA's smallest M) and deeper pipelines from 2026-12-06
DOT_CANDIDATES = ((32, 128, 4, 4), (64, 128, 4, 4), (64, 64, 6, 4), (64, 256, 3, 4), (128, 128, 3, 8),
                  (32, 256, 4, 4), (16, 128, 6, 4), (16, 256, 4, 4), (16, 512, 3, 4), (32, 128, 6, 4),
                  (64, 128, 6, 4), (64, 256, 4, 8))
GEMV_CANDIDATES = ((16, 512, 8, 1), (16, 1024, 8, 1), (32, 512, 8, 1), (8, 1024, 4, 1), (16, 512, 8, 3),
                   (8, 1024, 4, 2), (16, 256, 4, 4))
PER_SM_OPTIONS = (0, 1, 2, 4)


@dataclass(frozen=True)
class Row:
    kernel: str
    rows: int
    weight_bytes: int
    cublas_us: float
    rule_us: float
    best_us: float
    best: str
    err: float

    def pct(self, us: float) -> float:
        return 100.0 * self.weight_bytes / peak_bytes_per_s() / (us * 1e-6)


def candidates(m: int, n: int, k: int, dtype: torch.dtype) -> list[MxTiles]:
    out = []
    dot = [] if dtype == torch.float32 else DOT_CANDIDATES
    for bn, bk, stages, warps in dot:
        bk = block_k_for(k, bk)
        for per_sm in PER_SM_OPTIONS:
            split = split_for(math.ceil(n / bn), k, bk, per_sm * SMS)
            out.append(MxTiles(MxKernel.DOT, 16, bn, bk, split, warps, stages))
    for bn, bk, warps, stages in GEMV_CANDIDATES:
        bk = block_k_for(k, bk)
        for per_sm in PER_SM_OPTIONS:
            split = split_for(math.ceil(n / bn), k, bk, per_sm * SMS)
            out.append(MxTiles(MxKernel.GEMV, 1 << max(0, (m - 1).bit_length()), bn, bk, split, warps, stages))
    return list(dict.fromkeys(out))


def label(t: MxTiles) -> str:
    return f"{t.kernel.value} n{t.block_n} k{t.block_k} s{t.split_k} w{t.num_warps} st{t.num_stages}"


def time_tiles(xs, ws, tiles: MxTiles) -> float:
    return measure([lambda x=x, w=w: skinny_linear(x, w, tiles=tiles) for x, w in zip(xs, ws)])


def shape_rows(name: str, n: int, k: int, dtype, sweep: bool, dev, gen, row_counts=ROWS) -> list[Row]:
    ws = [(torch.randn(n, k, device=dev, generator=gen) * k ** -0.5).to(dtype)
          for _ in range(copies(n * k * dtype.itemsize))]
    rows = []
    for m in (r for r in row_counts if dtype != torch.float32 or r <= GEMV_MAX_ROWS):
        xs = [torch.randn(m, k, device=dev, generator=gen).to(dtype) for _ in ws]
        want = F.linear(xs[0].float(), ws[0].float())
        rule = skinny_tiles(m, n, k, dtype)
        err = error_of(lambda: skinny_linear(xs[0], ws[0], tiles=rule), want)
        cublas = measure([lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, ws)])
        rule_us = time_tiles(xs, ws, rule)
        best, best_us = rule, rule_us
        for t in candidates(m, n, k, dtype) if sweep else ():
            if t == rule or rel_err_of(xs[0], ws[0], t, want) > MAX_ERR:
                continue
            us = time_tiles(xs, ws, t)
            if us < best_us:
                best, best_us = t, us
        rows.append(Row(name, m, n * k * dtype.itemsize, cublas, rule_us, best_us, label(best), err))
        print(table_line(rows[-1]), flush=True)
    return rows


def fused_rows(name: str, n: int, k: int, dev, gen, row_counts=ROWS) -> list[Row]:
    """gate|up+act (n = 2I) or down+add: the skinny kernel's fused epilogue against cuBLAS + the separate op."""
    gated = name.endswith("+act")
    ws = [(torch.randn(n, k, device=dev, generator=gen) * k ** -0.5).to(torch.bfloat16)
          for _ in range(copies(n * k * 2))]
    rows = []
    for m in row_counts:
        xs = [torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
        adds = [torch.randn(m, n, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
        if gated:
            base = lambda x, w, a: gated_act(F.linear(x, w), GATE.activation, GATE.alpha, GATE.limit)  # noqa: E731
            ours = lambda x, w, a: skinny_linear(x, w, gate=GATE)  # noqa: E731
        else:
            base = lambda x, w, a: F.linear(x, w) + a  # noqa: E731
            ours = lambda x, w, a: skinny_linear(x, w, add=a)  # noqa: E731
        err = error_of(lambda: ours(xs[0], ws[0], adds[0]), base(xs[0].float(), ws[0].float(), adds[0].float())
                       if not gated else _gated_want(xs[0], ws[0]))
        calls = list(zip(xs, ws, adds))
        base_us = measure([lambda c=c: base(*c) for c in calls])
        ours_us = measure([lambda c=c: ours(*c) for c in calls])
        t = skinny_tiles(m, n // 2 if gated else n, k, gated=gated)
        rows.append(Row(name, m, n * k * 2, base_us, ours_us, ours_us, label(t), err))
        print(table_line(rows[-1]), flush=True)
    return rows


def _gated_want(x, w):
    """The fp32 torch reference of gate|up + act."""
    gu, i = F.linear(x.float(), w.float()), w.shape[0] // 2
    return gated_activation(Activation.SWIGLUOAI, gu[:, :i], gu[:, i:], GATE.alpha, GATE.limit)


def rel_err_of(x, w, tiles, want) -> float:
    try:
        return rel_err(skinny_linear(x, w, tiles=tiles), want)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not build is skipped
        print(f"  skipped {label(tiles)}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return math.inf


HEADER = (f"{'kernel':<15}{'rows':>5}{'MB':>7}{'cuBLAS us':>11}{'rule us':>9}{'best us':>9}{'rule %fl':>9}"
          f"{'best %fl':>9}{'rule/cuBLAS':>12}  best tiles")


def table_line(r: Row) -> str:
    return (f"{r.kernel:<15}{r.rows:>5}{r.weight_bytes / 1e6:>7.1f}{r.cublas_us:>11.1f}{r.rule_us:>9.1f}"
            f"{r.best_us:>9.1f}{r.pct(r.rule_us):>8.0f}%{r.pct(r.best_us):>8.0f}%"
            f"{r.cublas_us / r.rule_us:>11.2f}x  {r.best}  (err {r.err:.1e})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="time tile candidates per shape besides the rule's")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter smoke run)")
    p.add_argument("--shapes", nargs="+", default=None, help="only these rows (names as printed: qkv+index ...)")
    p.add_argument("--rows", nargs="+", type=int, default=list(ROWS), help="activation rows (default 1 4 16)")
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() or args.tiny):
        print("error: no GPU (use --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    print(HEADER)
    keep = lambda name: args.shapes is None or name in args.shapes  # noqa: E731
    rows = [r for name, n, k, dt in (TINY if args.tiny else SHAPES) if keep(name)
            for r in shape_rows(name, n, k, dt, args.sweep, dev, gen, tuple(args.rows))]
    rows += [r for name, n, k in (TINY_FUSED if args.tiny else FUSED) if keep(name)
             for r in fused_rows(name, n, k, dev, gen, tuple(args.rows))]
    bad = [r for r in rows if not r.err < MAX_ERR or math.isnan(r.rule_us)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

