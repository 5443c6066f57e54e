"""MXFP8 / NVFP4 decode kernels on the H200: what the runtime runs ("runtime"), against bf16, per kernel and batch,
beside the first-generation kernels ("old", row-major) and the tile-dequantizing ones ("new"), each with its error
against fp32.

    python benchmarks/mxfp8_speed.py --markdown mx_speed.md --json mx_speed.json     # H200, < 4 min
    TRITON_INTERPRET=1 python benchmarks/mxfp8_speed.py --tiny                        # CPU smoke run

Rows: the linear layers of one TP8 rank (mxfp8_gpu.Shapes) at batch 1, 4, 16, 64, and the routed experts
as the fused MoE: "moe-local" (16 local experts of 3072, every pick local: the memory-bound case) and
"moe-ep" (top-4 over 128, other ranks' picks dropped), in MXFP8 and with NVFP4 experts. Every call reads
its own copy of the weights (> 150 MB a graph replay, 3x the L2), as a decode step does across layers.
runtime: the kernel the runtime picks (mxfp8_linear / fused_moe naming no tiles: the GEMV at one row, the first
kernel at 2-32 rows, ...) on the weights laid out as the runtime holds them (weight_format.MX_LAYOUT, block-major by
default; NVFP4 experts packed); bf16: the same for bf16 weights (the MoE; cuBLAS for the linears). The figures and the
goal are the runtime's: % of floor: its time against the bytes it must move (weights of the rows or experts read,
activations in and out) at the floor's bandwidth (decode_floor.peak_bytes_per_s: the device's copy rate, measured
at the start, floor_bandwidth.py; before 2026-12-06 a fixed 4.0 TB/s). Every row also prints the read ceiling of
its weight bytes (read_ceiling.py: the fastest kernel that only reads them, timed the same way; for the MoE the
routings' mean bytes) and the runtime's time against it: a linear of a few MB cannot reach the copy rate even
without arithmetic. "alt": the other
new kernel (GEMV <-> dot) at batch 1. Error: max |got - want| / max |want| against dequantize-then-matmul in
fp32 on the same inputs. Goals (issue 16): >= 75% of the floor; moe-local at batch 16-64 >= 1.7x bf16.
Rows print as they are measured (a cut-short run still shows them); a kernel that fails reads NaN.
Exit code: 0 all errors below 2e-2, 1 one is not (or a kernel failed), 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth
from kernels_gpu import time_us
from mxfp8_gpu import (MX_BYTES, NV_BYTES, TINY, Shapes, as_runtime_holds, bench_device, make_experts,
                       rel_err, routing, runtime_experts)
from read_ceiling import read_us

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import fused_moe, moe_tiles
from m3bench.runtime.kernels.moe_quant import quant_moe_tiles
from m3bench.runtime.kernels.mx_linear import MxKernel, mx_tiles
from m3bench.runtime.kernels.mxfp8 import linear_tiles, mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref

TRITON = KernelBackend.TRITON
COLD_BYTES = 150e6  # weight bytes read by one graph replay
MAX_ERR = 2e-2
BATCHES = (1, 4, 16, 64)


@dataclass(frozen=True)
class Row:
    kernel: str
    fmt: str  # mxfp8 | nvfp4
    batch: int
    bytes_moved: int  # weights read, activations in and out
    bf16_us: float
    runtime_us: float  # what the runtime runs (the figures and the goal are its)
    old_us: float
    new_us: float
    alt_us: float | None
    err_runtime: float
    err_new: float
    err_old: float
    read_us: float = math.nan  # the read ceiling of the weight bytes (read_ceiling.py)

    @property
    def pct_floor(self) -> float:
        return 100.0 * self.bytes_moved / peak_bytes_per_s() / (self.runtime_us * 1e-6)

    @property
    def pct_read(self) -> float:
        return 100.0 * self.read_us / self.runtime_us

    @property
    def speedup(self) -> float:
        return self.bf16_us / self.runtime_us

    @property
    def errors(self) -> tuple[float, float, float]:
        return self.err_runtime, self.err_new, self.err_old


def measure(calls: list) -> float:
    """time_us of the calls; NaN (and the error printed) when a kernel fails to build or run."""
    try:
        return time_us(calls)
    except Exception as exc:  # noqa: BLE001 - one failing kernel must not hide the other rows
        print(f"  FAILED: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return math.nan


def error_of(fn, want: torch.Tensor) -> float:
    try:
        return rel_err(fn(), want)
    except Exception as exc:  # noqa: BLE001
        print(f"  FAILED: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return math.nan


def copies(weight_bytes: float) -> int:
    return 1 if not torch.cuda.is_available() else max(4, min(64, math.ceil(COLD_BYTES / weight_bytes)))


# ---- linear layers -------------------------------------------------------------------------------

def linear_weights(n: int, k: int, count: int, dev, gen, runtime_copy: bool = True):
    """count copies of random MXFP8 weights [n, k]: (fp8 row-major, scales, bf16 dequantized, fp8 as the runtime
    holds it; None without runtime_copy, for callers that lay the weights out themselves)."""
    out = []
    for _ in range(count):
        w, s = quant.quant_mxfp8(torch.randn(n, k, device=dev, generator=gen) * k ** -0.5)
        held = as_runtime_holds(w) if runtime_copy else None
        out.append((w, s, quant.dequant_mxfp8(w, s, torch.bfloat16), held))
    return out


def linear_row(name: str, n: int, k: int, b: int, ws: list, dev, gen) -> Row:
    xs = [torch.randn(b, k, device=dev, generator=gen).to(torch.bfloat16) for _ in ws]
    old_t, new_t = linear_tiles(b, n, k), mx_tiles(b, n, k)
    impls = {"bf16": lambda x, w: F.linear(x, w[2]),
             "runtime": lambda x, w: mxfp8_linear(x, w[3], w[1], backend=TRITON),
             "old": lambda x, w: mxfp8_linear(x, w[0], w[1], backend=TRITON, tiles=old_t),
             "new": lambda x, w: mxfp8_linear(x, w[0], w[1], backend=TRITON, tiles=new_t)}
    if b == 1:
        other = MxKernel.DOT if new_t.kernel is MxKernel.GEMV else MxKernel.GEMV
        alt_t = mx_tiles(b, n, k, other)
        impls["alt"] = lambda x, w: mxfp8_linear(x, w[0], w[1], backend=TRITON, tiles=alt_t)
    us = {name_: measure([lambda x=x, w=w, f=f: f(x, w) for x, w in zip(xs, ws)]) for name_, f in impls.items()}
    want = F.linear(xs[0].float(), ws[0][2].float())
    errs = {k_: error_of(lambda f=impls[k_]: f(xs[0], ws[0]), want) for k_ in ("runtime", "new", "old")}
    weight_bytes = int(n * k * MX_BYTES)
    return Row(name, "mxfp8", b, weight_bytes + 2 * b * (n + k), us["bf16"], us["runtime"], us["old"], us["new"],
               us.get("alt"), errs["runtime"], errs["new"], errs["old"], read_us(weight_bytes, dev)[0])


def linear_rows(sh: Shapes, batches, dev, gen) -> list[Row]:
    rows = []
    for name, n, k in sh.linears:
        ws = linear_weights(n, k, copies(n * k * MX_BYTES), dev, gen)
        for b in batches:
            rows.append(linear_row(name, n, k, b, ws, dev, gen))
            print(table_line(rows[-1]), flush=True)
        del ws
    return rows


# ---- routed experts ------------------------------------------------------------------------------

def moe_row(name: str, ex, held: dict, n_choice: int, b: int, sh: Shapes, dev, gen) -> list[Row]:
    """One row per expert format: the same routings through bf16, the runtime's (MXFP8 experts `held` as the runtime
    holds them), the first and the new kernels."""
    rs = [routing(b, n_choice, sh, dev, gen) for _ in range(8 if dev.type == "cuda" else 1)]
    hit = sum(int(torch.unique(r["topk_ids"][r["topk_ids"] >= 0]).numel()) for r in rs) / len(rs)
    old_t = moe_tiles(b * sh.top_k, sh.n_local, sh.inter, sh.hidden)
    new_t = quant_moe_tiles(b * sh.top_k, sh.n_local, sh.inter, sh.hidden)
    bf16_us = measure([lambda r=r: fused_moe(**r, **ex.bf16, backend=TRITON) for r in rs])
    out = []
    for fmt, weights, wbytes, runtime in (("mxfp8", ex.mx, MX_BYTES, held), ("nvfp4", ex.nv, NV_BYTES, ex.nv)):
        impls = {"runtime": lambda r, w=runtime: fused_moe(**r, **w, backend=TRITON),
                 "old": lambda r, w=weights: fused_moe(**r, **w, backend=TRITON, tiles=old_t),
                 "new": lambda r, w=weights: fused_moe(**r, **w, backend=TRITON, tiles=new_t)}
        us = {k: measure([lambda r=r, f=f: f(r) for r in rs]) for k, f in impls.items()}
        x32 = {k: v.float() if v.is_floating_point() else v for k, v in rs[0].items()}
        deq = weights["scales"].dequantized(weights["w_gate"], weights["w_up"], weights["w_down"], torch.float32)
        want = fused_moe_ref(**x32, w_gate=deq[0], w_up=deq[1], w_down=deq[2])
        errs = {k: error_of(lambda f=f: f(rs[0]), want) for k, f in impls.items()}
        weight_bytes = hit * 3 * sh.inter * sh.hidden * wbytes
        out.append(Row(name, fmt, b, int(weight_bytes + 4 * b * sh.hidden), bf16_us, us["runtime"], us["old"],
                       us["new"], None, errs["runtime"], errs["new"], errs["old"], read_us(int(weight_bytes), dev)[0]))
    return out


def moe_rows(sh: Shapes, batches, dev, gen) -> list[Row]:
    ex = make_experts(sh, dev, gen)
    held = runtime_experts(ex.mx)  # laid out once for every row
    rows = []
    for name, n_choice in (("moe-local", sh.n_local), ("moe-ep", sh.n_routed)):
        for b in batches:
            rows += moe_row(name, ex, held, n_choice, b, sh, dev, gen)
            print(table_line(rows[-2]) + "\n" + table_line(rows[-1]), flush=True)
    return rows


# ---- output --------------------------------------------------------------------------------------

def goal(r: Row) -> str:
    """'ok' / 'MISS' against issue 16's goals for this row (75% of the floor; 1.7x bf16 where memory-bound)."""
    memory_bound = r.kernel == "moe-local" and r.batch >= 16
    met = r.pct_floor >= 75.0 and (not memory_bound or r.speedup >= 1.7)
    return "ok" if met else "MISS"


def goal_summary(rows: list[Row]) -> str:
    """One line: rows meeting issue 16's goals, per format and for the memory-bound rows."""
    def count(sel):  # noqa: E306
        return f"{sum(goal(r) == 'ok' for r in sel)}/{len(sel)}"
    mx, nv = [r for r in rows if r.fmt == "mxfp8"], [r for r in rows if r.fmt == "nvfp4"]
    bound = [r for r in mx if r.kernel == "moe-local" and r.batch >= 16]
    return (f"goals met: MXFP8 {count(mx)} rows, NVFP4 {count(nv)} rows; memory-bound MXFP8 rows "
            f"(moe-local, batch >= 16) {count(bound)}")


def table_line(r: Row) -> str:
    alt = f"{r.alt_us:.1f}" if r.alt_us is not None else "-"
    read = (f"{r.read_us:.1f} | {r.pct_read:.0f}%" if math.isfinite(r.read_us) else "- | -")
    return (f"| {r.kernel} | {r.fmt} | {r.batch} | {r.bf16_us:.1f} | {r.runtime_us:.1f} | {r.pct_floor:.0f}% | "
            f"{read} | {r.speedup:.2f}x | {r.old_us:.1f} | {r.new_us:.1f} | {alt} | {r.err_runtime:.1e} | "
            f"{r.err_new:.1e} | {r.err_old:.1e} | {goal(r)} |")


def markdown_table(rows: list[Row]) -> str:
    lines = ["| kernel | weights | batch | bf16 us | runtime us | % of floor | read us | % of read | x bf16 | old us | "
             "new us | alt us | err runtime | err new | err old | goal |",
             "|---|---|---:|" + "---:|" * 12 + "---|"]
    return "\n".join(lines + [table_line(r) for r in rows])


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU under TRITON_INTERPRET=1)")
    ap.add_argument("--only", choices=("linear", "moe"), default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = bench_device(args.tiny)
    if dev is None:
        return 2
    sh = replace(TINY, batches=(1, 3)) if args.tiny else replace(Shapes(), batches=BATCHES)
    gen = torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    rows = [] if args.only == "moe" else linear_rows(sh, sh.batches, dev, gen)
    rows += [] if args.only == "linear" else moe_rows(sh, sh.batches, dev, gen)
    table = markdown_table(rows) + "\n\n" + goal_summary(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"pct_floor": r.pct_floor, "pct_read": r.pct_read,
                                                      "speedup": r.speedup, "goal": goal(r)} for r in rows], indent=1))
    bad = [r for r in rows if not (all(e <= MAX_ERR for e in r.errors) and r.runtime_us > 0 and r.new_us > 0
                                   and r.old_us > 0)]  # NaN: failed
    for r in bad:
        print(f"ERROR too large: {r.kernel} {r.fmt} batch {r.batch}: runtime {r.err_runtime:.2e} new {r.err_new:.2e} "
              f"old {r.err_old:.2e}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
