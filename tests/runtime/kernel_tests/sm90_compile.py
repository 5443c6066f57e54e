"""Compile every Triton kernel variant the wrappers launch for sm90 (H100/H200), on a CPU.

Run as a script WITHOUT TRITON_INTERPRET (the test runs it in a subprocess): the wrappers run on
small CPU tensors at M3 per-GPU shapes, their kernel launches are recorded instead of run, and
each recorded launch is compiled ahead of time with triton.compile for GPUTarget("cuda", 90).
Prints one line per variant; exit code 1 when any compile fails. --all: every q_len bucket.

PDL (kernels/pdl_triton.py): the launches are recorded under every backend.Pdl mode (the device check waived,
as on an H200); each launch must pass PDL with the mode's code and launch_pdl exactly when on, and every kernel
of the modules must be launched. PDL-off variants compile as before (no griddepcontrol in their PTX); every
variant's ON twin and one EARLY variant per kernel compile too, each with the static race check on its PTX
(pdl_checks.py: the wait before any global access) and the same instructions as its PDL-off variant (only
scheduled around the wait: the same arithmetic). --record-only: the launch checks alone; --pdl-only: no PDL-off
compiles (nor the instruction comparison).
"""

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") != "1", "sm90 compilation needs the real JIT"

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from m3bench.runtime.kernels import (
    add_norm_triton,
    attention_triton,
    backend,
    gated_act_triton,
    kv_write_triton,
    moe_gemv_triton,
    moe_quant_triton,
    moe_triton,
    msa_index_triton,
    mx_tiles_triton,
    mxfp8_triton,
    norm_rope_triton,
    router_triton,
    skinny_heads_triton,
    skinny_triton,
)
from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.add_norm import add_rms_norm_fused
from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.kv_write import write_pages
from m3bench.runtime.kernels.moe import MoeScales, MoeTiles, SharedExpert, fused_moe, gemv_tiles
from m3bench.runtime.kernels.msa_index import BlockScores, msa_select_blocks, select_top_blocks
from m3bench.runtime.kernels.mxfp8 import mxfp8_linear
from m3bench.runtime.kernels.norm_rope import Branch, BranchWrite, norm_rope_write, norm_rope_write_pair
from m3bench.runtime.kernels.router import router_topk, router_topk_align

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pdl_checks.py, beside this script
from pdl_checks import flag_problems, has_gdc, opcode_counts, trigger_side, wait_problems  # noqa: E402

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "u8",
           torch.int32: "i32", torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}
LAUNCHES = []
SM90_MAX_SMEM = 232448  # bytes of shared memory one H100/H200 block may use
KERNEL_MODULES = (attention_triton, msa_index_triton, moe_triton, kv_write_triton, mxfp8_triton, router_triton,
                  add_norm_triton, norm_rope_triton, mx_tiles_triton, moe_quant_triton, gated_act_triton, skinny_triton,
                  skinny_heads_triton, moe_gemv_triton)


class Recorder:
    """Stands in for a JITFunction: kernel[grid](...) records the call instead of running it."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: LAUNCHES.append((self.fn, args, kwargs))


def _sig_type(v):
    if isinstance(v, torch.Tensor):
        return "*" + _DTYPES[v.dtype]
    if isinstance(v, bool):
        return "i1"
    return "i32" if isinstance(v, int) else "fp32"


def _divisible_by_16(v) -> bool:
    """What the CUDA JIT marks tt.divisibility 16: 16-byte aligned tensors, ints that are multiples of 16."""
    if isinstance(v, torch.Tensor):
        return v.data_ptr() % 16 == 0
    return isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0


def compile_launch(fn, args, kwargs):
    """The launch compiled as the GPU's JIT would build it: with its divisibility hints (without them the
    loads do not vectorize, e.g. NVFP4 / FP8 key bytes load one by one)."""
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "launch_pdl") if k in kwargs}
    names = [p.name for p in fn.params]
    values = dict(zip(names, args)) | kwargs
    consts = {p.name: values[p.name] for p in fn.params if p.is_constexpr}
    sig = {n: "constexpr" if n in consts else _sig_type(values[n]) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params)
             if not p.is_constexpr and not p.do_not_specialize and _divisible_by_16(values[p.name])}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def record_all(q_lens):
    for mod in KERNEL_MODULES:
        for name in dir(mod):
            if isinstance(getattr(mod, name), triton.JITFunction) and name.endswith("_kernel"):
                setattr(mod, name, Recorder(getattr(mod, name)))
    g = torch.Generator().manual_seed(0)
    bt = torch.randint(0, 4, (4, 8), generator=g, dtype=torch.int32)
    lens = torch.full((4,), 900, dtype=torch.int32)
    T = KernelBackend.TRITON
    for q_len in q_lens:
        qsl = torch.arange(5, dtype=torch.int32) * q_len
        q = torch.randn(4 * q_len, 8, 128).to(torch.bfloat16)
        x = torch.randn(4, 1, 128, 128)
        caches = {"bf16": x.to(torch.bfloat16), "fp8": kq.quantize_fp8(x),
                  "nvfp4": kq.Nvfp4Pages(*kq.quantize_nvfp4(x, 1.0), torch.ones(1))}
        sel = torch.zeros(4 * q_len, 1, 16, dtype=torch.int32)
        # the top-k in the attention launch, over 8k / 128k-token score rows (by rank, by rounds)
        scores = [BlockScores(torch.randn(4 * q_len, 1, w), 16, 128) for w in (65, 1025)]
        for cache in caches.values():
            paged_attention(q, cache, cache, bt, lens, qsl, 0.088, max_query_len=q_len, backend=T)
            for selected in (sel, *scores):
                paged_attention(q, cache, cache, bt, lens, qsl, 0.088, selected_blocks=selected,
                                max_query_len=q_len, backend=T)
        for cache in caches.values():
            write_pages(cache, q[:, :1], torch.arange(4 * q_len), backend=T)
        write_pages(x[:, 0].to(torch.bfloat16), q[:, 0], torch.arange(4 * q_len), backend=T)
        iq = torch.randn(4 * q_len, 1, 128).to(torch.bfloat16)
        nvfp4_ik = kq.Nvfp4Pages(*kq.quantize_nvfp4(x[:, 0], 1.0), torch.ones(1))
        for ik in (x[:, 0].to(torch.bfloat16), kq.quantize_fp8(x[:, 0]), nvfp4_ik):
            msa_select_blocks(iq, ik, bt, lens, qsl, 16, max_query_len=q_len, backend=T)
        record_nvfp4_asm(q, iq, caches["nvfp4"], nvfp4_ik, bt, lens, qsl, sel, q_len)
    for n_tok in (1, 64):
        xs = torch.randn(n_tok, 6144).to(torch.bfloat16)
        wg = torch.empty(16, 3072, 6144, dtype=torch.bfloat16)
        wd = torch.empty(16, 6144, 3072, dtype=torch.bfloat16)
        ids = torch.randint(0, 16, (n_tok, 4), dtype=torch.int32)
        fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T)
        if n_tok == 1:  # the router's top-k in the gate|up launch
            from m3bench.runtime.kernels.router import KernelRoute, routing_outputs

            w, routed, al = routing_outputs(1, 4, 16, 16, False, xs.device)
            fused_moe(xs, wg, wg, wd, routed, w, backend=T, alignment=al,
                      route=KernelRoute(torch.randn(1, 128), torch.randn(128), 2.0, 16))
        fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, add=xs)  # the shared expert beside
        record_split_down(xs, wg, wd, ids, T)
        if n_tok == 1:  # the one-token GEMVs (kernels/moe_gemv.py), plain
            fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, tiles=gemv_tiles(3072, 6144), add=xs)
        ws = torch.empty(384, 6144, dtype=torch.bfloat16)  # the shared expert inside (split-K at batch 1)
        fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T,
                  shared=SharedExpert(ws, ws, torch.empty(6144, 384, dtype=torch.bfloat16)))
    fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, tiles=MoeTiles(64, 128, 64, 8, 3))
    record_mxfp8(T)
    record_fused(caches, x[:, 0])
    record_skinny()


def record_split_down(xs, wg, wd, ids, backend, scales=None):
    """The one-token split tiles, their down GEMM's K whole and in chunks (kernels.moe.ROUTED_SPLIT_DOWN 1, 2, 4)."""
    from m3bench.runtime.kernels import moe

    before = moe.ROUTED_SPLIT_DOWN
    try:
        for down in (1, 2, 4):
            moe.ROUTED_SPLIT_DOWN = down
            fused_moe(xs, wg, wg, wd, ids, torch.rand(xs.shape[0], 4), backend=backend, scales=scales, add=xs)
    finally:
        moe.ROUTED_SPLIT_DOWN = before


def record_skinny():
    """The skinny decode GEMMs at one TP8 rank's shapes: plain, with an add, gated, and the fp32 router GEMV."""
    from m3bench.runtime.kernels.reference import MoeActivation
    from m3bench.runtime.kernels.skinny import Gate, skinny_linear

    gate = Gate(MoeActivation.SWIGLUOAI, 1.702, 7.0)
    for rows in (1, 16):
        for n, k in ((1920, 6144), (6144, 1024), (6144, 384)):
            x, w = torch.randn(rows, k).to(torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16)
            skinny_linear(x, w)
            skinny_linear(x, w, add=torch.empty(rows, n, dtype=torch.bfloat16))
        for inter in (384, 1536):  # shared expert, dense MLP
            skinny_linear(torch.randn(rows, 6144).to(torch.bfloat16), torch.empty(2 * inter, 6144, dtype=torch.bfloat16),
                          gate=gate)
    for rows in (1, 4):
        skinny_linear(torch.randn(rows, 6144), torch.empty(128, 6144))


def record_nvfp4_asm(q, iq, cache, ik, bt, lens, qsl, sel, q_len):
    """The NVFP4 decode in PTX (kv_tiles_triton.nvfp4_to_f16_asm), chosen on CUDA tensors only."""
    from m3bench.runtime.kernels import attention, msa_index

    T = KernelBackend.TRITON
    attention.nvfp4_asm = msa_index.nvfp4_asm = lambda t: True
    try:
        paged_attention(q, cache, cache, bt, lens, qsl, 0.088, max_query_len=q_len, backend=T)
        paged_attention(q, cache, cache, bt, lens, qsl, 0.088, selected_blocks=sel, max_query_len=q_len, backend=T)
        msa_select_blocks(iq, ik, bt, lens, qsl, 16, max_query_len=q_len, backend=T)
    finally:
        attention.nvfp4_asm = msa_index.nvfp4_asm = lambda t: False


def record_mxfp8(T):
    """MXFP8 / NVFP4 experts and MXFP8 linear layers at one TP8 rank's shapes (batch 1 and 64)."""
    from m3bench.runtime.kernels.moe import moe_tiles
    from m3bench.runtime.kernels.mx_linear import MxKernel, mx_tiles
    from m3bench.runtime.kernels.mxfp8 import linear_tiles

    for n_tok in (1, 64):
        xs = torch.randn(n_tok, 6144).to(torch.bfloat16)
        wg = torch.empty(16, 3072, 6144, dtype=torch.float8_e4m3fn)
        wd = torch.empty(16, 6144, 3072, dtype=torch.float8_e4m3fn)
        scales = MoeScales(torch.empty(16, 3072, 192, dtype=torch.uint8), torch.empty(16, 3072, 192, dtype=torch.uint8),
                           torch.empty(16, 6144, 96, dtype=torch.uint8))
        ids = torch.randint(0, 16, (n_tok, 4), dtype=torch.int32)
        fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, scales=scales)
        record_split_down(xs, wg, wd, ids, T, scales)
        if n_tok == 1:  # the one-token GEMVs, MXFP8
            fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, scales=scales, tiles=gemv_tiles(3072, 6144))
        old = moe_tiles(n_tok * 4, 16, 3072, 6144)
        fused_moe(xs, wg, wg, wd, ids, torch.rand(n_tok, 4), backend=T, scales=scales, tiles=old)
        e4m3 = torch.float8_e4m3fn
        nv = MoeScales(torch.empty(16, 3072, 384, dtype=e4m3), torch.empty(16, 3072, 384, dtype=e4m3),
                       torch.empty(16, 6144, 192, dtype=e4m3), torch.empty(16, 3072), torch.empty(16, 3072),
                       torch.empty(16, 6144))
        fused_moe(xs, torch.empty(16, 3072, 3072, dtype=torch.uint8), torch.empty(16, 3072, 3072, dtype=torch.uint8),
                  torch.empty(16, 6144, 1536, dtype=torch.uint8), ids, torch.rand(n_tok, 4), backend=T, scales=nv)
        for n, k in ((1024 + 2 * 128 + 128 + 128, 6144), (6144, 1024), (2 * 384, 6144), (6144, 384)):
            w, sc = torch.empty(n, k, dtype=torch.float8_e4m3fn), torch.empty(n, k // 32, dtype=torch.uint8)
            for m in sorted({n_tok, 2, 16, 256}):  # decode BLOCK_M 16 / 64, prefill 128
                mxfp8_linear(torch.randn(m, k).to(torch.bfloat16), w, sc, backend=T)
            mxfp8_linear(torch.randn(n_tok, k).to(torch.bfloat16), w, sc, backend=T, tiles=linear_tiles(n_tok, n, k))
            mxfp8_linear(torch.randn(1, k).to(torch.bfloat16), w, sc, backend=T, tiles=mx_tiles(1, n, k, MxKernel.GEMV))


def record_fused(caches, x3):
    """The fused ops at the rank's shapes: router epilogue, residual add + norm, norm + RoPE + KV write."""
    router_topk(torch.randn(64, 128), torch.randn(128), 4, 2.0)
    for n_tok in (1, 4, 16):  # the router aligning one rank's picks (16 of 128 experts, + the shared one)
        router_topk_align(torch.randn(n_tok, 128), torch.randn(128), 4, 2.0, 16, 16, 16, True)
    for width in (64, 1024, 8192):  # MSA top-16 of 8k / 128k / 1M-token block-score rows: rank, rounds, chunks
        select_top_blocks(torch.randn(1, 1, width), torch.empty(1, 1, 16, dtype=torch.int32), 128,
                          torch.full((1,), 900, dtype=torch.int32), torch.arange(2, dtype=torch.int32), 16, 1)
    h = torch.randn(64, 6144).to(torch.bfloat16)
    add_rms_norm_fused(h, h, torch.zeros(6144, dtype=torch.bfloat16), 1e-6, True)
    add_rms_norm_fused(h, h, torch.zeros(6144, dtype=torch.bfloat16), 1e-6, True, y32_out=torch.empty(64, 6144))
    from m3bench.runtime.kernels.moe_sum import MoeSum

    for n_tok, chunks, shared in ((1, 2, False), (4, 1, True)):  # a fused MoE's sum in the add + norm: B1 split
        ids = torch.randint(-1, 16, (4 * n_tok,), dtype=torch.int32)  # down (shared beside, its add), B4 shared inside
        s = MoeSum(torch.empty(chunks, 5 * n_tok, 6144), ids, 16, 4, shared, None if shared else h[:n_tok],
                   torch.bfloat16)
        add_rms_norm_fused(h[:n_tok], s, torch.zeros(6144, dtype=torch.bfloat16), 1e-6, True)
    from m3bench.runtime.kernels.gated_act import gated_act
    from m3bench.runtime.kernels.reference import MoeActivation

    gated_act(torch.randn(64, 2 * 1536).to(torch.bfloat16), MoeActivation.SWIGLUOAI, 1.702, 7.0)  # dense MLP, TP8
    d, y = 128, torch.randn(4, 15 * 128).to(torch.bfloat16)
    cos = sin = torch.randn(4, 32)
    slots, w = torch.arange(4), torch.zeros(d, dtype=torch.bfloat16)
    index_caches = (x3.to(torch.bfloat16), kq.quantize_fp8(x3), kq.Nvfp4Pages(*kq.quantize_nvfp4(x3, 1.0), torch.ones(1)))
    for cache, ik in zip(caches.values(), index_caches):
        norm_rope_write(y, Branch(0, 8 * d, 9 * d, 8, 1, 1, d), w, w, 1e-6, True, cos, sin, slots, cache, cache)
        norm_rope_write(y, Branch(10 * d, 14 * d, 0, 4, 1, 0, d), w, w, 1e-6, True, cos, sin, slots, ik)
        norm_rope_write_pair(y, BranchWrite(Branch(0, 8 * d, 9 * d, 8, 1, 1, d), w, w, cache, cache),
                             BranchWrite(Branch(10 * d, 14 * d, 0, 4, 1, 0, d), w, w, ik), 1e-6, True, cos, sin, slots)
    record_skinny_heads(caches, index_caches, cos, sin, w)


def record_skinny_heads(caches, index_caches, cos, sin, w):
    """The projection ending in its heads' norm / RoPE / writes at one rank's shapes: an MSA layer's q|k|v|index
    q|index k (1920 x 6144) and a dense layer's q|k|v (1280 x 6144), 1 and 4 rows, every cache format."""
    from m3bench.runtime.kernels.skinny_heads import skinny_heads

    d = 128
    main = Branch(0, 8 * d, 9 * d, 8, 1, 1, d)
    for rows in (1, 4):
        x, slots = torch.randn(rows, 6144).to(torch.bfloat16), torch.arange(rows)
        c, s = cos[:1].expand(rows, -1), sin[:1].expand(rows, -1)
        for cache, ik in zip(caches.values(), index_caches):
            skinny_heads(x, torch.empty(15 * d, 6144, dtype=torch.bfloat16), None,
                         (BranchWrite(main, w, w, cache, cache), BranchWrite(Branch(10 * d, 14 * d, 0, 4, 1, 0, d), w,
                                                                             w, ik)), 1e-6, True, c, s, slots)
            skinny_heads(x, torch.empty(10 * d, 6144, dtype=torch.bfloat16), None,
                         (BranchWrite(main, w, w, cache, cache),), 1e-6, True, c, s, slots)


PDL_MODES = (backend.Pdl.OFF, backend.Pdl.ON, backend.Pdl.EARLY)


def record_modes(q_lens) -> dict:
    """record_all's launches under each PDL mode, the device check waived as on an H200 (the tensors are CPU's)."""
    chosen, device = backend.PDL["launch"], backend.pdl_device
    backend.pdl_device = lambda t: True
    runs = {}
    try:
        for mode in PDL_MODES:
            backend.PDL["launch"] = mode
            LAUNCHES.clear()
            try:
                record_all(q_lens)
            except Exception as exc:  # noqa: BLE001 - compile what was recorded so far
                print(f"recording ({mode.value}) stopped early: {type(exc).__name__}: {exc}")
            runs[mode] = list(LAUNCHES)
    finally:
        backend.PDL["launch"], backend.pdl_device = chosen, device
    return runs


def kernel_names() -> set[str]:
    """The kernels of KERNEL_MODULES (record_all wrapped each in a Recorder)."""
    return {v.fn.__name__ for mod in KERNEL_MODULES for v in vars(mod).values() if isinstance(v, Recorder)}


def launch_problems(runs: dict) -> list[str]:
    """Kernels never launched; launches whose PDL keywords do not match their mode (pdl_checks.flag_problems)."""
    problems = []
    for mode, launches in runs.items():
        named = [(fn.__name__, [p.name for p in fn.params], kwargs) for fn, _, kwargs in launches]
        problems += [f"{p} under {mode.value}" for p in flag_problems(named, backend.PDL_CODE[mode])]
        launched = {fn.__name__ for fn, _, _ in launches}
        problems += [f"{name}: never launched under {mode.value} (record it in record_all)"
                     for name in kernel_names() - launched]
    return sorted(set(problems))


def variant_key(fn, args, kwargs, pdl: bool = True) -> tuple:
    """What tells variants apart: kernel, constexprs and options (pdl False: PDL's left out), argument types."""
    kw = {k: v for k, v in kwargs.items() if pdl or k not in ("PDL", "launch_pdl")}
    return fn.__name__, tuple(sorted((k, str(v)) for k, v in kw.items())), tuple(_sig_type(a) for a in args)


def variants(launches: list) -> list:
    """The first launch of each distinct variant."""
    seen = {}
    for launch in launches:
        seen.setdefault(variant_key(*launch), launch)
    return list(seen.values())


def one_per_kernel(launches: list) -> list:
    first = {}
    for launch in variants(launches):
        first.setdefault(launch[0].__name__, launch)
    return list(first.values())


def pdl_problems(ptx: str, code: int, launch_pdl: bool, off_ptx: str | None) -> list[str]:
    """PDL off: no griddepcontrol at all. On: the wait first (pdl_checks), the trigger on its side (code 1 after
    the wait, 2 before it), built with launch_pdl, and (given its PDL-off twin's PTX) the same instructions."""
    if code == 0:
        return ["griddepcontrol in a PDL-off variant"] if has_gdc(ptx) else []
    problems = wait_problems(ptx)
    want = "after" if code == 1 else "before"
    if trigger_side(ptx) != want:
        problems.append(f"launch_dependents {trigger_side(ptx)} the wait, want {want}")
    if not launch_pdl:
        problems.append("built without launch_pdl")
    if off_ptx is not None and opcode_counts(ptx) != opcode_counts(off_ptx):
        problems.append("other instructions than its PDL-off variant")
    return problems


def compile_variant(fn, args, kwargs, off_ptx: str | None = None) -> str | None:
    """Compile one variant for sm90 and check it (pdl_problems); prints ok / FAIL; its PTX, None when it failed."""
    try:
        compiled = compile_launch(fn, args, dict(kwargs))
        smem = compiled.metadata.shared
        if smem > SM90_MAX_SMEM:
            raise RuntimeError(f"needs {smem} B of shared memory, sm90 has {SM90_MAX_SMEM}")
        problems = pdl_problems(compiled.asm["ptx"], kwargs["PDL"], compiled.metadata.launch_pdl, off_ptx)
        if problems:
            raise RuntimeError("PDL check: " + "; ".join(problems))
        print(f"ok   {fn.__name__} smem={smem} {dict(kwargs)}")
        return compiled.asm["ptx"]
    except Exception as exc:  # noqa: BLE001 - report every failing variant
        print(f"FAIL {fn.__name__} {dict(kwargs)}: {type(exc).__name__}: {str(exc)[:2000]}")
        return None


def main() -> int:
    q_lens = (1, 4, 16) if "--all" in sys.argv else (4,)
    runs = record_modes(q_lens)
    flags = launch_problems(runs)
    for p in flags:
        print(f"FLAG {p}")
    print(f"launch flags: {'ok' if not flags else f'{len(flags)} problems'} "
          f"({len(kernel_names())} kernels, {len(runs)} PDL modes)")
    if "--record-only" in sys.argv:
        return 1 if flags or not runs[backend.Pdl.OFF] else 0
    off = [] if "--pdl-only" in sys.argv else variants(runs[backend.Pdl.OFF])
    off_ptx = {variant_key(*launch, pdl=False): compile_variant(*launch) for launch in off}
    pdl = variants(runs[backend.Pdl.ON]) + one_per_kernel(runs[backend.Pdl.EARLY])
    pdl_ok = [compile_variant(*launch, off_ptx.get(variant_key(*launch, pdl=False))) is not None for launch in pdl]
    n_ok = sum(p is not None for p in off_ptx.values()) + sum(pdl_ok)
    print(f"{n_ok}/{len(off) + len(pdl)} variants compiled for sm90")
    print(f"race check: {sum(pdl_ok)}/{len(pdl)} PDL variants wait before any global access "
          f"({len({launch[0].__name__ for launch in pdl})} kernels)"
          + ("" if not off else "; the same instructions as their PDL-off variants"))
    return 1 if flags or n_ok < len(off) + len(pdl) or not pdl else 0


if __name__ == "__main__":
    sys.exit(main())
