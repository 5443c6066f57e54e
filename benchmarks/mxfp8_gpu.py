"""MXFP8 against bf16 weights on the H200: kernel table at MiniMax-M3's TP8/EP8 rank shapes, then the
decode step of the rank's layers (all 60 in MXFP8: ~54 GB; bf16 as many as fit).

    python benchmarks/mxfp8_gpu.py                    # H200: checks, kernel table, decode steps (< 8 min)
    python benchmarks/mxfp8_gpu.py --kernels-only --markdown table.md
    TRITON_INTERPRET=1 python benchmarks/mxfp8_gpu.py --tiny   # CPU smoke run, tiny shapes, no model step

Kernels, per batch 1..64 (one token a sequence): every linear layer of a rank (qkv + index of an MSA
layer [1536, 6144], o [6144, 1024], dense gate|up [3072, 6144] and down [6144, 1536], shared expert
gate|up [768, 6144] and down [6144, 384]) as bf16 `F.linear` (cuBLAS) and as the MXFP8 Triton GEMM
(kernels/mxfp8.py) on weights laid out as the runtime holds them (block-major by default), and the routed
experts as the fused MoE in bf16 and MXFP8: "moe-local" (16 local experts of 3072, every pick local: the
memory-bound case) and "moe-ep" (top-4 over 128, other ranks'
picks dropped), also with NVFP4 experts (the ModelOpt release's). Bytes moved: weights (bf16 2 B a
weight, MXFP8 1 + 1/32 B, NVFP4 1/2 + 1/16 B) of the rows read (for the
MoE, the distinct local experts routed to) plus activations in and out; % of the floor's bandwidth (the device's
copy rate, floor_bandwidth.py). Each kernel is
first checked against dequantize-then-matmul in fp32 on fresh random inputs. Timings: median over
CUDA-graph replays of calls on distinct inputs (benchmarks/kernels_gpu.py's `time_us`).
Exit code: 0 all checks passed, 1 a check failed, 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import itertools
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
from kernels_gpu import n_copies, time_us

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeScales, fused_moe
from m3bench.runtime.kernels.mxfp8 import mxfp8_linear
from m3bench.runtime.kernels.reference import fused_moe_ref
from m3bench.runtime.layers.weight_format import MX_LAYOUT, MxLayout

TRITON = KernelBackend.TRITON
MX_BYTES = 1 + 1 / 32
NV_BYTES = 0.5 + 1 / 16


@dataclass(frozen=True)
class Shapes:
    linears: tuple[tuple[str, int, int], ...] = (
        ("qkv+index", 1536, 6144), ("o_proj", 6144, 1024), ("dense gate|up", 3072, 6144),
        ("dense down", 6144, 1536), ("shared gate|up", 768, 6144), ("shared down", 6144, 384))
    hidden: int = 6144
    n_local: int = 16
    inter: int = 3072
    n_routed: int = 128
    top_k: int = 4
    batches: tuple[int, ...] = (1, 4, 16, 32, 64)


TINY = Shapes(linears=(("qkv", 96, 64), ("o", 64, 64)), hidden=64, n_local=4, inter=32, n_routed=8, top_k=2,
              batches=(1, 3))


@dataclass(frozen=True)
class Row:
    kernel: str
    weights: str  # bf16 | mxfp8
    batch: int
    us: float
    bytes_moved: int

    @property
    def pct_peak(self) -> float:
        return 100.0 * self.bytes_moved / (self.us * 1e-6) / peak_bytes_per_s()


# ---- inputs and checks ---------------------------------------------------------------------------

def mx_weight(n: int, k: int, dev, gen, lead: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(*lead, n, k, device=dev, generator=gen) * k ** -0.5
    return quant.quant_mxfp8(w)


def runtime_block_major() -> bool:
    """Whether the runtime holds MXFP8 weights block-major (weight_format.MX_LAYOUT)."""
    return MX_LAYOUT["layout"] is MxLayout.BLOCK_MAJOR


def as_runtime_holds(w: torch.Tensor) -> torch.Tensor:
    """MXFP8 weights [..., N, K] laid out as the runtime holds them (block-major by default)."""
    return quant.block_major(w) if runtime_block_major() else w


def block_major_experts(weights: dict) -> dict:
    """The same MXFP8 experts with block-major weights (quant.block_major; gate and up stay views of one tensor)."""
    gu = quant.block_major(torch.cat([weights["w_gate"], weights["w_up"]], dim=1))
    i = weights["w_gate"].shape[1]
    return weights | {"w_gate": gu[:, :i], "w_up": gu[:, i:], "w_down": quant.block_major(weights["w_down"])}


def runtime_experts(mx: dict) -> dict:
    """MXFP8 experts (row-major, make_experts) laid out as the runtime holds them."""
    return block_major_experts(mx) if runtime_block_major() else mx


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-12))


def check_linear(n: int, k: int, dev, gen) -> float:
    w, s = mx_weight(n, k, dev, gen)
    x = torch.randn(8, k, device=dev, generator=gen).to(torch.bfloat16)
    want = F.linear(x.float(), quant.dequant_mxfp8(w, s, torch.float32))
    return rel_err(mxfp8_linear(x, as_runtime_holds(w), s, backend=TRITON), want)


@dataclass(frozen=True)
class Experts:
    bf16: dict
    mx: dict
    nv: dict  # the same weights in NVFP4 (the ModelOpt release's routed experts)


def nv_stacked(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[E, R, K] -> NVFP4 (packed, e4m3 scales, per-row fp32 global [E, R]), one global per expert."""
    parts = [quant.quant_nvfp4(w[e]) for e in range(w.shape[0])]
    glob = torch.stack([p[2].expand(w.shape[1]) for p in parts]).contiguous()
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), glob


def make_experts(sh: Shapes, dev, gen) -> Experts:
    gu, sgu = mx_weight(2 * sh.inter, sh.hidden, dev, gen, (sh.n_local,))
    d, sd = mx_weight(sh.hidden, sh.inter, dev, gen, (sh.n_local,))
    i = sh.inter
    mx = {"w_gate": gu[:, :i], "w_up": gu[:, i:], "w_down": d, "scales": MoeScales(sgu[:, :i], sgu[:, i:], sd)}
    deq = (quant.dequant_mxfp8(gu, sgu, torch.bfloat16), quant.dequant_mxfp8(d, sd, torch.bfloat16))
    bf = {"w_gate": deq[0][:, :i], "w_up": deq[0][:, i:], "w_down": deq[1]}
    (pgu, ngu, ggu), (pd, nd, gd) = nv_stacked(deq[0]), nv_stacked(deq[1])
    nv = {"w_gate": pgu[:, :i], "w_up": pgu[:, i:], "w_down": pd,
          "scales": MoeScales(ngu[:, :i], ngu[:, i:], nd, ggu[:, :i], ggu[:, i:], gd)}
    return Experts(bf, mx, nv)


def runtime_held(ex: Experts) -> Experts:
    """The experts with their MXFP8 weights laid out as the runtime holds them (the others as they are)."""
    return replace(ex, mx=runtime_experts(ex.mx))


def routing(n_tok: int, n_choice: int, sh: Shapes, dev, gen) -> dict:
    """Sigmoid top-k over n_choice experts, renormalized x 2; other ranks' picks become -1."""
    w, ids = torch.topk(torch.sigmoid(torch.randn(n_tok, n_choice, device=dev, generator=gen)), sh.top_k, dim=-1)
    ids = torch.where(ids < sh.n_local, ids, -1).to(torch.int32)
    x = torch.randn(n_tok, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
    return {"x": x, "topk_ids": ids, "topk_weights": (w / w.sum(-1, keepdim=True) * 2.0).float()}


def check_moe(weights: dict, sh: Shapes, dev, gen) -> float:
    """The quantized fused MoE against the reference MoE on its weights dequantized (fp32)."""
    r = routing(16, sh.n_local, sh, dev, gen)
    got = fused_moe(**r, **weights, backend=TRITON)
    x32 = {k: v.float() if v.is_floating_point() else v for k, v in r.items()}
    deq = weights["scales"].dequantized(weights["w_gate"], weights["w_up"], weights["w_down"], torch.float32)
    want = fused_moe_ref(**x32, w_gate=deq[0], w_up=deq[1], w_down=deq[2])
    return rel_err(got, want)


# ---- timings -------------------------------------------------------------------------------------

def linear_rows(name: str, n: int, k: int, sh: Shapes, dev, gen) -> list[Row]:
    w, s = mx_weight(n, k, dev, gen)
    wb = quant.dequant_mxfp8(w, s, torch.bfloat16)
    w = as_runtime_holds(w)
    rows = []
    for b in sh.batches:
        act = 2 * b * (n + k)
        for label, nbytes, fn in (("bf16", n * k * 2 + act, lambda x: F.linear(x, wb)),
                                  ("mxfp8", int(n * k * MX_BYTES) + act, lambda x: mxfp8_linear(x, w, s, backend=TRITON))):
            xs = [torch.randn(b, k, device=dev, generator=gen).to(torch.bfloat16) for _ in range(n_copies(nbytes))]
            rows.append(Row(name, label, b, time_us([lambda x=x, fn=fn: fn(x) for x in xs]), nbytes))
    return rows


def moe_rows(name: str, ex: Experts, n_choice: int, sh: Shapes, dev, gen) -> list[Row]:
    rows = []
    per_expert = 3 * sh.inter * sh.hidden
    for b in sh.batches:
        rs = [routing(b, n_choice, sh, dev, gen) for _ in range(8 if dev.type == "cuda" else 1)]
        hit = sum(int(torch.unique(r["topk_ids"][r["topk_ids"] >= 0]).numel()) for r in rs) / len(rs)
        act = 4 * b * sh.hidden
        for label, weights, wbytes in (("bf16", ex.bf16, 2), ("mxfp8", ex.mx, MX_BYTES), ("nvfp4", ex.nv, NV_BYTES)):
            calls = [lambda r=r, weights=weights: fused_moe(**r, **weights, backend=TRITON) for r in rs]
            rows.append(Row(name, label, b, time_us(calls), int(hit * per_expert * wbytes + act)))
    return rows


def kernel_rows(sh: Shapes, dev, gen) -> list[Row]:
    rows = []
    for name, n, k in sh.linears:
        rows += linear_rows(name, n, k, sh, dev, gen)
        print(f"  timed {name}", flush=True)
    ex = runtime_held(make_experts(sh, dev, gen))
    rows += moe_rows("moe-local", ex, sh.n_local, sh, dev, gen)
    rows += moe_rows("moe-ep", ex, sh.n_routed, sh, dev, gen)
    return rows


def run_checks(sh: Shapes, dev, gen) -> dict[str, float]:
    out = {f"linear {n}x{k}": check_linear(n, k, dev, gen) for _, n, k in sh.linears}
    ex = runtime_held(make_experts(sh, dev, gen))
    out["moe mxfp8"] = check_moe(ex.mx, sh, dev, gen)
    out["moe nvfp4"] = check_moe(ex.nv, sh, dev, gen)
    return out


# ---- the decode step of the rank's layers --------------------------------------------------------

def decode_step_rows(layers_bf16: int, layers_mx: int, batches: tuple[int, ...], ctx: int, dev,
                     formats: tuple[str, ...] = ("plain", "mxfp8", "nvfp4-experts"),
                     routed_splits: tuple[int, ...] = (), routed_downs: tuple[int, ...] = (),
                     routed_gemvs: tuple[int, ...] = ()) -> list[dict]:
    """Step ms of the TP8/EP8 rank model (decode_step.py's shapes) in bf16, MXFP8 (row- and block-major) and
    NVFP4-expert weights (the ModelOpt release's mix: NVFP4 routed experts, MXFP8 block-major elsewhere), packed
    and with the experts' codes held as e4m3 bytes (runtime.nv_codes); each batch under every
    kernels.moe.ROUTED_SPLIT_TOKENS of `routed_splits` x ROUTED_SPLIT_DOWN of `routed_downs` x one token's routed
    experts as GEMVs or not (`routed_gemvs` 1 / 0: the rows' expert format in ROUTED_GEMV_FMTS or not) (each default:
    the runtime's; a row's label names the values other than the runtime's)."""
    from decode_floor import M3Shapes
    from decode_setup import decode_meta, fill_random_, graphed, hf_m3_config, median_ms, our_config

    from m3bench.runtime.attention.select import make_backend
    from m3bench.runtime.kernels import moe as moe_kernels
    from m3bench.runtime.kv_cache import KVCache, KVDtype
    from m3bench.runtime.layers.weight_format import LinearFormat, MxLayout, NvCodes, set_mx_layout, set_nv_codes
    from m3bench.runtime.model import M3ForCausalLM

    s, rows = M3Shapes(), []
    default_split, default_down = moe_kernels.ROUTED_SPLIT_TOKENS, moe_kernels.ROUTED_SPLIT_DOWN
    default_fmts = moe_kernels.ROUTED_GEMV_FMTS
    for fmt, layers in ((LinearFormat.PLAIN, layers_bf16), (LinearFormat.MXFP8, layers_mx),
                        (LinearFormat.NVFP4_EXPERTS, layers_mx)):
        if fmt.value not in formats:
            continue
        cfg = our_config(hf_m3_config(s, layers, ctx * 2 + s.page))
        model = M3ForCausalLM(cfg, torch.bfloat16, dev, backend=make_backend("auto", dev, cfg, s.page), weights=fmt)
        model.init_dummy(0)
        kv = KVCache(cfg, max(batches) * (ctx // s.page + 2) + 1, s.page, KVDtype.FP8, torch.bfloat16, dev)
        fill_random_(kv)
        layouts = {LinearFormat.MXFP8: (MxLayout.ROW_MAJOR, MxLayout.BLOCK_MAJOR),
                   LinearFormat.NVFP4_EXPERTS: (MxLayout.BLOCK_MAJOR, NvCodes.E4M3)}.get(fmt, (None,))
        code = {LinearFormat.PLAIN: 0, LinearFormat.MXFP8: 1}.get(fmt, -1)  # the experts' FMT code (NVFP4: none)
        default_gemv = int(code in default_fmts)
        for layout in layouts:
            label = fmt.value if layout is None else f"{fmt.value} {layout.value}"
            if layout is NvCodes.E4M3:  # the experts' codes as e4m3 bytes, block-major (weight_format.set_nv_codes)
                label = f"{fmt.value} e4m3 codes"
                meta, ids = decode_meta(s, 2, ctx, dev), torch.arange(2, device=dev)
                packed = model.compute_logits(model(ids, meta.positions, meta, kv)).float()
                set_nv_codes(model, NvCodes.E4M3, MxLayout.BLOCK_MAJOR)
                codes = model.compute_logits(model(ids, meta.positions, meta, kv)).float()
                print(f"  e4m3 codes against packed, B=2 logits: rel max |diff| "
                      f"{rel_err(codes, packed):.2e}", flush=True)
            elif layout is not None:
                set_mx_layout(model, layout)
            for b in batches:
                meta, ids = decode_meta(s, b, ctx, dev), torch.randint(0, s.vocab, (b,), device=dev)
                for split, down, gemv in itertools.product(routed_splits or (default_split,),
                                                           routed_downs or (default_down,),
                                                           routed_gemvs or (default_gemv,)):
                    moe_kernels.ROUTED_SPLIT_TOKENS, moe_kernels.ROUTED_SPLIT_DOWN = split, down
                    moe_kernels.ROUTED_GEMV_FMTS = (default_fmts | {code}) if gemv else (default_fmts - {code})
                    try:
                        run, graph = graphed(lambda: model.compute_logits(model(ids, meta.positions, meta, kv)), dev)
                        ms = median_ms(run, dev, 3, 20)
                    finally:
                        moe_kernels.ROUTED_SPLIT_TOKENS, moe_kernels.ROUTED_SPLIT_DOWN = default_split, default_down
                        moe_kernels.ROUTED_GEMV_FMTS = default_fmts
                    name = (label + (f" split<={split}" if split != default_split else "")
                            + (f" down/{down}" if down != default_down else "")
                            + ((" gemv" if gemv else " no-gemv") if gemv != default_gemv else ""))
                    rows.append({"weights": name, "layers": layers, "batch": b, "context": ctx, "step_ms": ms,
                                 "ms_per_layer": ms / layers, "cuda_graph": graph, "routed_split_tokens": split,
                                 "routed_split_down": down, "routed_gemv": gemv})
                    print(f"  {name:<18} {layers} layers B={b:<3} step {ms:8.3f} ms ({ms / layers:.3f} ms/layer)",
                          flush=True)
                    del run, graph
        del model, kv
        torch.cuda.empty_cache()
    return rows


# ---- output --------------------------------------------------------------------------------------

def markdown_table(rows: list[Row]) -> str:
    """One line per kernel and batch: us and % of peak per weight format, speedup over bf16."""
    by = {(r.kernel, r.batch, r.weights): r for r in rows}
    fmts = [f for f in ("mxfp8", "nvfp4") if any(r.weights == f for r in rows)]
    head = "| kernel | batch | bf16 us | bf16 % peak |" + "".join(f" {f} us | {f} % peak | {f} speedup |" for f in fmts)
    lines = [head, "|---|---:|---:|---:|" + "---:|---:|---:|" * len(fmts)]
    for kernel, batch in dict.fromkeys((r.kernel, r.batch) for r in rows):
        b = by[(kernel, batch, "bf16")]
        cells = [f"| {kernel} | {batch} | {b.us:.1f} | {b.pct_peak:.0f}% |"]
        for f in fmts:
            q = by.get((kernel, batch, f))
            cells.append(f" {q.us:.1f} | {q.pct_peak:.0f}% | {b.us / q.us:.2f}x |" if q else " - | - | - |")
        lines.append("".join(cells))
    return "\n".join(lines)


def step_table(rows: list[dict]) -> str:
    lines = ["| weights | layers | batch | step ms | ms / layer |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['weights']} | {r['layers']} | {r['batch']} | {r['step_ms']:.3f} | {r['ms_per_layer']:.4f} |"
              for r in rows]
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU under TRITON_INTERPRET=1)")
    ap.add_argument("--kernels-only", action="store_true", help="skip the decode steps of the rank model")
    ap.add_argument("--steps-only", action="store_true", help="only the decode steps (after the checks)")
    ap.add_argument("--bf16-layers", type=int, default=40, help="layers of the bf16 rank model (60 do not fit)")
    ap.add_argument("--step-formats", nargs="+", choices=("plain", "mxfp8", "nvfp4-experts"),
                    default=["plain", "mxfp8", "nvfp4-experts"], help="weight formats of the decode-step rows")
    ap.add_argument("--routed-split", type=int, nargs="+", default=[],
                    help="kernels.moe.ROUTED_SPLIT_TOKENS values the decode-step rows run under, side by side "
                         "(default: the runtime's)")
    ap.add_argument("--routed-split-down", type=int, nargs="+", default=[],
                    help="kernels.moe.ROUTED_SPLIT_DOWN values (K chunks of the one-token split tiles' down GEMM) the "
                         "decode-step rows run under (default: the runtime's)")
    ap.add_argument("--routed-gemv", type=int, nargs="+", default=[], choices=(0, 1),
                    help="1: one token's routed experts as GEMVs (kernels.moe.ROUTED_GEMV_FMTS), 0: not; the decode-step "
                         "rows run under each (default: the runtime's)")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    return ap.parse_args(argv)


def bench_device(tiny: bool) -> torch.device | None:
    """CUDA, or the CPU for --tiny (under TRITON_INTERPRET=1); None (the reason printed) without either."""
    if not tiny and not torch.cuda.is_available():
        print("no CUDA device: run on the H200 (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return None
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = bench_device(args.tiny)
    if dev is None:
        return 2
    sh, gen = (TINY if args.tiny else Shapes()), torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    checks = run_checks(sh, dev, gen)
    bad = {k: v for k, v in checks.items() if v > 2e-2}
    for k, v in checks.items():
        print(f"check {k}: rel err {v:.2e} {'FAIL' if k in bad else 'ok'}", flush=True)
    rows = [] if args.steps_only else kernel_rows(sh, dev, gen)
    steps = [] if args.kernels_only or args.tiny else decode_step_rows(args.bf16_layers, 60, (1, 16, 64),
                                                                       args.context, dev, tuple(args.step_formats),
                                                                       tuple(args.routed_split),
                                                                       tuple(args.routed_split_down),
                                                                       tuple(args.routed_gemv))
    table = (markdown_table(rows) if rows else "") + ("\n\n" + step_table(steps) if steps else "")
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"checks": checks, "kernels": [asdict(r) | {"pct_peak": r.pct_peak}
                                                                       for r in rows], "steps": steps}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
