"""Fused MoE entry point: Triton on CUDA, the torch reference on CPU.

    out = fused_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, MoeActivation.SWIGLUOAI)

x [T, H]; w_gate, w_up [E, I, H] (views into one stacked [E, 2I, H] tensor work); w_down
[E, H, I]; topk_ids [T, K] local expert ids, ids outside [0, E) (experts of other ranks)
contribute nothing; topk_weights [T, K] routing weights (already renormalized and scaled).
MXFP8 experts: float8_e4m3fn weights plus `scales=MoeScales(gate, up, down)` (uint8 E8M0, one per 32
inputs: [E, I, H/32], [E, I, H/32], [E, H, I/32]). NVFP4 experts: packed uint8 weights [E, I, H/2] /
[E, H, I/2] plus `MoeScales(gate, up, down, gate_global, up_global, down_global)` (e4m3 per 16 inputs,
fp32 global per row [E, I] / [E, H]). The kernels dequantize either in registers.
`alignment=MoeAlignment(...)` (with `tiles`) skips the alignment launch: the router's kernel made it.
`shared=SharedExpert(w_gate [I_s, H], w_up [I_s, H], w_down [H, I_s])` (plain weights, the routed
experts plain too) adds the shared expert as one more expert every token picks with weight 1, in the
same launches; batches of at most SKINNY_TOKENS tokens then split the gate+up reduction (split-K,
`MoeTiles.split_k`) so the few weight rows a skinny batch reads spread over the whole GPU. Without the shared
expert, routed experts split K up to ROUTED_SPLIT_TOKENS tokens (first_generation_tiles: one active expert then
fills the GPU).
`add` ([T, H] in x's dtype, or a callable giving it) joins the final sum (fp32) where the first-generation
kernels run (plain experts, or MoeTiles given; the tile-dequantizing ones refuse it): a callable is called right before
the sum's launch, so a caller can join a side stream (kernels/lanes.py) that made it while the experts ran.
`defer_sum=True` returns those kernels' result before the sum's launch (kernels/moe_sum.MoeSum), for the residual add +
norm after the MoE to sum in its own launch (kernels/add_norm.py).
`route=KernelRoute(logits, bias, scale, first)` (one token, routed experts alone, on the first generation's split tiles):
the gate|up launch routes the token itself from the router's logits and fills topk_weights, topk_ids and alignment
(kernels.router.routing_outputs' buffers) for the launches after it, with no router launch before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels import reference
from m3bench.runtime.kernels.backend import (
    KernelBackend,
    interpreting,
    next_pow2,
    pdl_args,
    use_triton,
)
from m3bench.runtime.kernels.moe_align import (  # noqa: F401 (the fused MoE's public parts, re-exported)
    MAX_KERNEL_ALIGN_PAIRS,
    MoeAlignment,
    align_slots,
    max_padded_pairs,
    moe_align,
    moe_align_torch,
)
from m3bench.runtime.kernels.moe_args import check_weights, down_chunks, global_args, scale_args
from m3bench.runtime.kernels.moe_scales import MoeScales
from m3bench.runtime.kernels.moe_sum import MoeSum
from m3bench.runtime.kernels.mx_linear import block_stride, check_counters, split_counters
from m3bench.runtime.kernels.quant_kernels import QuantKernels, moe_generation
from m3bench.runtime.kernels.reference import MoeActivation

if TYPE_CHECKING:
    from m3bench.runtime.kernels.moe_quant import QuantMoeTiles
    from m3bench.runtime.kernels.router import KernelRoute

ACT_CODE = {MoeActivation.SWIGLUOAI: 0, MoeActivation.SILU: 1}


@dataclass(frozen=True)
class SharedExpert:
    """The ungated-by-router shared expert as one more expert of the fused MoE (plain weights)."""

    w_gate: torch.Tensor  # [I_s, H]
    w_up: torch.Tensor  # [I_s, H]
    w_down: torch.Tensor  # [H, I_s]

    @property
    def inter(self) -> int:
        return self.w_gate.shape[0]

    def reference(self, x: torch.Tensor, activation: MoeActivation, alpha: float, limit: float) -> torch.Tensor:
        """The expert on x [T, H] in fp32 (fp64 for fp64 inputs) with the fused MoE's activation."""
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        xc = x.to(cdt)
        h = reference.moe_activation_ref(xc @ self.w_gate.to(cdt).T, xc @ self.w_up.to(cdt).T, activation, alpha,
                                         limit)
        return h @ self.w_down.to(cdt).T


def expert_format(scales: MoeScales | None, w: torch.Tensor) -> int:
    """The kernels' FMT for experts w with these scales: 0 plain, 1 MXFP8, 2 NVFP4 (packed codes), 3 NVFP4 with its
    codes as e4m3 bytes (quant.e2m1_as_e4m3)."""
    if scales is None:
        return 0
    if scales.nvfp4:
        return 3 if w.dtype == torch.float8_e4m3fn else 2
    return 1


def _sub_block(fmt: int) -> int:
    """The first-generation kernels' sub-dot width: one scale block (MXFP8 32, NVFP4 16)."""
    return quant.NV_BLOCK if fmt == 3 else quant.MX_BLOCK


NV_CODES_BLOCK_K = 64  # FMT 3: four 16-wide sub-blocks a K step (mx_block_steps' most)


@dataclass(frozen=True)
class MoeTiles:
    """Tile sizes of the grouped GEMMs (one config per batch bucket); block_n_down 0: block_n."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    block_n_down: int = 0
    split_k: int = 1  # gate+up K-chunks of the shared expert (> 1: fp32 partials, the last chunk activates)
    split_k_routed: int = 1  # ... of a routed expert (divides split_k)
    split_down: int = 1  # K-chunks of the down GEMM (> 1: fp32 partials a chunk, summed by the sum kernel; routed
    #                      experts alone)
    gemv: bool = False  # one token's routed experts as GEMVs (kernels/moe_gemv.py: gemv_tiles), no alignment

    @property
    def n_down(self) -> int:
        return self.block_n_down or self.block_n


MIN_PROGRAMS = 264  # two waves of 132 SMs: narrow N tiles until the skinny GEMMs fill them
SKINNY_TOKENS = 4  # with a shared expert, batches up to this many tokens run the split-K path
# Without it (the shared expert beside, layers.moe.SharedBeside), routed experts split K up to this many tokens
# (first_generation_tiles: routed_split_tiles, quantized mx_split_tiles): a decode rank at B1 has 0-1 local picks in
# ~92% of its MoE layers, and one expert on moe_tiles' grid (N tiles for four active blocks) ran 56.5 us against
# 45.4 split (H200; floor 26.8; 0 picks 5.1 against 7.7). The 60-layer rank step at B1 (realistic routing):
# 4.301 -> 4.155 ms bf16, 8.072 -> 7.782 ms MXFP8 block-major (H200, 2026-12-06, docs/performance.md 2i).
ROUTED_SPLIT_TOKENS = 1
# K-chunks of those split tiles' down GEMM (MoeTiles.split_down): at one local pick its 64-wide N tiles are 96
# programs (fewer than the SMs), each streaming all 3072 inputs; in 2 chunks 192 programs, their fp32 partials summed
# by the sum kernel (no launch more). H100, one local pick, us: bf16 57.5 -> 52.8, MXFP8 51.8 -> 44.1 (4 chunks 52.9 /
# 41.5; no pick 7.0 -> 7.5 / 9.1); the 37-layer rank step at B1 (realistic routing) 2.941 -> 2.912 ms, MXFP8 60 layers
# 8.912 -> 8.668 ms (4 chunks: 2.945 / 8.853) (docs/performance.md 2j). 1: unsplit.
ROUTED_SPLIT_DOWN = 2
MAX_SPLIT_K = 32
# Expert formats (the kernels' FMT: 0 plain, 1 MXFP8) whose routed experts run one token as GEMVs (kernels/moe_gemv.py,
# gemv_tiles) where no shared expert is inside. MXFP8: one local pick 43.7-43.9 -> 33.7-33.9 us, faster at 0-4 picks;
# the 60-layer MXFP8 rank step at B1 block-major 8.349 -> 8.191 and 8.236 -> 8.074 ms, row-major 9.283 -> 8.867 and
# 9.234 -> 8.818 ms (H100, two runs, 2026-12-06; B16 / B64 unchanged). Plain experts stay on the split tiles: their
# GEMVs win alone (one pick 52.7 -> 49.0 us) but the bf16 step lost 2-4% at B1 (docs/performance.md 2m, 2n).
ROUTED_GEMV_FMTS: frozenset[int] = frozenset({1})


def moe_tiles(n_pairs: int, n_experts: int, inter: int, hidden: int, shared_inter: int = 0,
              n_tok: int = 0) -> MoeTiles:
    """Skinny batches: BLOCK_M 16 (M padded to 16) and N tiles narrowed until the grid of the
    few active experts fills the GPU; bigger batches: larger M tiles. With a shared expert (its
    intermediate shared_inter) and at most SKINNY_TOKENS tokens: split-K (skinny_tiles)."""
    if shared_inter and n_tok <= SKINNY_TOKENS:
        return skinny_tiles(inter, shared_inter, hidden)
    per_expert = n_pairs / max(1, n_experts)  # mean pairs of an expert (upper bound of active)
    if per_expert <= 8:
        base = MoeTiles(16, 64, 128, num_warps=4, num_stages=4)
    elif per_expert <= 24:
        base = MoeTiles(32, 64, 128, num_warps=4, num_stages=4)
    else:
        base = MoeTiles(64, 128, 64, num_warps=8, num_stages=3)
    blocks = min(n_pairs, n_experts) * max(1, math.ceil(per_expert / base.block_m))
    return replace(base, block_n=_narrow(base.block_n, blocks, inter),
                   block_n_down=_narrow(base.block_n, blocks, hidden))


def mx_moe_tiles(n_pairs: int, n_experts: int, inter: int, hidden: int) -> MoeTiles:
    """The first generation's tiles for MXFP8 experts: moe_tiles' BLOCK_M, BLOCK_N 64 (not narrowed), 3 stages,
    the down GEMM's N tiles 128 from BLOCK_M 32. H200 sweep (benchmarks/mxfp8_speed_sweep.py moe-v1, 2026-12-03,
    block-major weights, us): moe-local B1 108.1 -> 93.3, B4 249.2 -> 207.5, B16 297.5 -> 290.6, B64 389.4 -> 364.3;
    moe-ep B1 55.7 -> 47.8, B64 355.9 -> 340.5 (moe_tiles' choice -> these)."""
    base = moe_tiles(n_pairs, n_experts, inter, hidden)
    return replace(base, block_n=64, num_stages=3, block_n_down=128 if base.block_m > 16 else 64,
                   num_warps=4)


def first_generation_tiles(n_tok: int, top_k: int, n_experts: int, inter: int, hidden: int, quantized: bool,
                           shared_inter: int = 0, fmt: int = -1) -> MoeTiles:
    """The tiles fused_moe runs its first-generation kernels on when a call names none: quantized experts
    mx_moe_tiles, plain ones moe_tiles (with the shared expert inside at a few tokens: its split-K); without the
    shared expert, at most ROUTED_SPLIT_TOKENS tokens split the routed experts' K (one active expert then fills
    the GPU by itself): mx_split_tiles, routed_split_tiles; one token of experts whose format (fmt, expert_format)
    is in ROUTED_GEMV_FMTS runs the GEMVs (gemv_tiles)."""
    if n_tok == 1 and not shared_inter and fmt in ROUTED_GEMV_FMTS:
        return gemv_tiles(inter, hidden)
    if 0 < n_tok <= ROUTED_SPLIT_TOKENS and not shared_inter:
        return mx_split_tiles(inter, hidden) if quantized else routed_split_tiles(inter, hidden)
    if quantized:
        return mx_moe_tiles(n_tok * top_k, n_experts, inter, hidden)
    return moe_tiles(n_tok * top_k, n_experts, inter, hidden, shared_inter, n_tok)


def mx_split_tiles(inter: int, hidden: int) -> MoeTiles:
    """One token's quantized routed experts (MXFP8, NVFP4 codes as e4m3 bytes) with K split so one active expert's
    gate|up fills MIN_PROGRAMS programs: BLOCK_N 64 and BLOCK_K 128 (mx_moe_tiles'), the down GEMM's N tiles 64, its K
    in ROUTED_SPLIT_DOWN chunks; the gate|up partials summed by the tile's last chunk. H200 sweep at one local pick
    (2026-12-06, us, the down GEMM whole): 71.6 on mx_moe_tiles' grid, 45.8 here, 53.7 with down tiles 32; 0 picks
    5.2 -> 7.6."""
    return _split_tiles(inter, hidden, 64)


def routed_split_tiles(inter: int, hidden: int) -> MoeTiles:
    """One token's plain routed experts with K split so one active expert's gate|up fills MIN_PROGRAMS programs:
    BLOCK_N 32, BLOCK_K 128, the down GEMM's N tiles 64, its K in ROUTED_SPLIT_DOWN chunks. H200 sweep at one local
    pick (2026-12-06, us, the down GEMM whole): 56.5 on moe_tiles' grid, 45.4 here, 46.3 with down tiles 32;
    skinny_tiles(inter, inter, hidden) ran slower than moe_tiles in the rank step (BLOCK_K 64, down tiles 16)."""
    return _split_tiles(inter, hidden, 32)


def gemv_tiles(inter: int, hidden: int) -> MoeTiles:
    """One token's routed experts as GEMVs (kernels/moe_gemv.py): the MXFP8 linear GEMV's tiles (16 rows, BLOCK_K 512,
    8 warps, one stage), gate|up K split and the down GEMM's K in chunks so that one local pick's programs fit a wave
    of each kernel's resident ones with at least two K steps each (block_m: the router kernel's alignment, unused)."""
    from m3bench.runtime.kernels import moe_gemv as mg

    bk = mg.gemv_block_k(hidden, inter)
    split = mg.gemv_split(inter, hidden, mg.GEMV_BLOCK_N, bk, mg.GATE_UP_PER_SM)
    return MoeTiles(16, mg.GEMV_BLOCK_N, bk, num_warps=mg.GEMV_WARPS, num_stages=1, block_n_down=mg.GEMV_BLOCK_N,
                    split_k=split, split_k_routed=split,
                    split_down=mg.gemv_split(hidden, inter, mg.GEMV_BLOCK_N, bk, mg.DOWN_PER_SM), gemv=True)


def _split_tiles(inter: int, hidden: int, block_n: int, block_k: int = 128) -> MoeTiles:
    split = _fill_split(inter, hidden, block_n, block_k)
    down = max(1, min(ROUTED_SPLIT_DOWN, math.ceil(inter / block_k)))
    return MoeTiles(16, block_n, block_k, num_warps=4, num_stages=3, block_n_down=64, split_k=split,
                    split_k_routed=split, split_down=down)


def skinny_tiles(inter: int, shared_inter: int, hidden: int, block_n: int = 32, block_k: int = 64) -> MoeTiles:
    """A batch of a few tokens reads each active expert's weights once: the shared expert alone (or
    one routed expert) must fill MIN_PROGRAMS programs, so the gate+up reduction over `hidden` splits
    into chunks (fewer for the wider routed experts), the down GEMM narrows its N tiles to 16."""
    s_shared = _fill_split(shared_inter, hidden, block_n, block_k)
    return MoeTiles(16, block_n, block_k, num_warps=4, num_stages=4, block_n_down=16, split_k=s_shared,
                    split_k_routed=min(s_shared, _fill_split(inter, hidden, block_n, block_k)))


def _fill_split(n: int, hidden: int, block_n: int, block_k: int) -> int:
    """K chunks (a power of two, <= MAX_SPLIT_K and the BLOCK_K steps of `hidden`) that make one expert's n
    output columns in BLOCK_N tiles fill MIN_PROGRAMS programs."""
    want = math.ceil(MIN_PROGRAMS / math.ceil(n / block_n))
    return max(1, min(MAX_SPLIT_K, next_pow2(want), hidden // block_k))


def _narrow(block_n: int, blocks: int, n: int) -> int:
    while block_n > 16 and blocks * math.ceil(n / block_n) < MIN_PROGRAMS:
        block_n //= 2
    return block_n


def fused_moe(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    activation: MoeActivation = MoeActivation.SWIGLUOAI,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    backend: KernelBackend = KernelBackend.AUTO,
    tiles: MoeTiles | QuantMoeTiles | None = None,
    scales: MoeScales | None = None,
    shared: SharedExpert | None = None,
    alignment: MoeAlignment | None = None,
    add: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    defer_sum: bool = False,
    route: KernelRoute | None = None,
) -> torch.Tensor | MoeSum:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) (+ shared(x[t])) (+ add[t]) -> [T, H]; with
    defer_sum (and no out) the first-generation kernels return their partials before the sum's launch (MoeSum)."""
    if route is not None and not use_triton(backend, x):
        raise ValueError("fused_moe: routing in the gate|up launch needs the Triton kernels")
    if not use_triton(backend, x):
        if scales is not None:
            w_gate, w_up, w_down = scales.dequantized(w_gate, w_up, w_down, x.dtype)
        y = fused_moe_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit,
                                None if add is not None else out, shared)
        return y if add is None else _added(y, _addend(add), out)
    _check_shared(shared, scales, w_gate, x)
    if tiles is None and (scales is None or first_generation(scales, w_gate)):
        tiles = first_generation_tiles(*topk_ids.shape, w_gate.shape[0], w_gate.shape[1], x.shape[1],
                                       scales is not None, shared.inter if shared else 0, expert_format(scales, w_gate))
    _check_route(route, tiles, topk_ids, topk_weights, shared, alignment)
    if isinstance(tiles, MoeTiles) and tiles.gemv:
        return _gemv_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out, tiles,
                         scales, shared, add, defer_sum)
    if isinstance(tiles, MoeTiles) and expert_format(scales, w_gate) == 3 and tiles.block_k > NV_CODES_BLOCK_K:
        tiles = replace(tiles, block_k=NV_CODES_BLOCK_K)
    if scales is not None and not isinstance(tiles, MoeTiles):  # quantized: the tile-dequantizing kernels
        from m3bench.runtime.kernels.moe_quant import fused_moe_quant

        if add is not None:
            raise ValueError("fused_moe: add needs the first-generation kernels (MoeTiles)")
        return fused_moe_quant(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out,
                               scales, tiles)
    if tiles.split_down > 1 and shared is not None:
        raise ValueError("fused_moe: the down GEMM splits K for routed experts alone (no shared expert inside)")
    n_tok, top_k = topk_ids.shape
    n_exp, n_shared = w_gate.shape[0], n_tok if shared is not None else 0
    ids = topk_ids.reshape(-1).contiguous()
    if alignment is None:
        sorted_ids, block_expert, n_post = moe_align(ids, n_exp, tiles.block_m, n_shared)
    else:  # aligned by the router's kernel for these tiles
        sorted_ids, block_expert, n_post = alignment.sorted_ids, alignment.block_expert, alignment.n_post
    inter = x.new_empty((sorted_ids.shape[0], w_gate.shape[1]), dtype=_inter_dtype(x, scales, activation, w_gate))
    _launch_gate_up(x, w_gate, w_up, inter, sorted_ids, block_expert, n_post, top_k, activation,
                    alpha, limit, tiles, scales, shared, None if route is None else (route, topk_weights, ids))
    weights = topk_weights.reshape(-1).contiguous()
    y = _launch_down(inter, w_down, n_tok * top_k + n_shared, sorted_ids, block_expert, n_post, weights, tiles,
                     scales, shared)
    return MoeSum(y, ids, n_exp, top_k, shared is not None, add, x.dtype).ended(defer_sum, out)


def _gemv_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out, tiles, scales, shared,
              add, defer_sum) -> torch.Tensor | MoeSum:
    """fused_moe on the one-token GEMVs (kernels/moe_gemv.py): the down GEMM's planes summed as the first generation's."""
    from m3bench.runtime.kernels.moe_gemv import moe_gemv

    if shared is not None:
        raise ValueError("fused_moe: the one-token GEMVs run routed experts alone (no shared expert inside)")
    ids, weights = topk_ids.reshape(-1).contiguous(), topk_weights.reshape(-1).contiguous()
    y = moe_gemv(x, w_gate, w_up, w_down, ids, weights, activation, alpha, limit, tiles, scales)
    return MoeSum(y, ids, w_gate.shape[0], topk_ids.shape[1], False, add, x.dtype).ended(defer_sum, out)


def first_generation(scales: MoeScales, w_gate: torch.Tensor) -> bool:
    """Quantized experts without given tiles run the first-generation kernels (kernels/moe_triton.py): the
    generation picked for their format, or block-major weights, or NVFP4 codes as e4m3 bytes (only those kernels
    read them)."""
    return (moe_generation(scales.gate_global is not None) is QuantKernels.V1 or w_gate.dim() == 4
            or expert_format(scales, w_gate) == 3)


def _addend(add) -> torch.Tensor | None:
    return add() if callable(add) else add


def _added(y: torch.Tensor, add: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """y + add summed in fp32 (fp64 for fp64), in y's dtype (into out when given): the sum kernel's arithmetic."""
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    s = (y.to(acc) + add.to(acc)).to(y.dtype)
    return s if out is None else out.copy_(s)


def _inter_dtype(x: torch.Tensor, scales: MoeScales | None, activation: MoeActivation, w: torch.Tensor) -> torch.dtype:
    """The gate|up output's dtype: fp16 where the down GEMM's MXFP8 sub-dots run in fp16 (mxfp8_triton.act_block)
    and the activation bounds it (swigluoai: |h| <= limit * (limit + 1), far below fp16's 65504; fp16 also keeps
    3 more mantissa bits than bf16), else x's."""
    if (expert_format(scales, w) in (1, 3) and x.dtype == torch.bfloat16 and activation is MoeActivation.SWIGLUOAI
            and not interpreting()):
        return torch.float16
    return x.dtype


def fused_moe_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out=None,
                        shared: SharedExpert | None = None) -> torch.Tensor:
    """The torch reference of fused_moe (plain weights), the shared expert added in fp32."""
    if shared is None:
        return reference.fused_moe_ref(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit,
                                       out)
    routed = reference.fused_moe_ref(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32),
                                     w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit)
    out = torch.empty_like(x) if out is None else out
    return out.copy_(routed + shared.reference(x, activation, alpha, limit))


def _check_route(route: KernelRoute | None, tiles, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 shared: SharedExpert | None, alignment: MoeAlignment | None) -> None:
    """Routing in the gate|up launch: the first generation's tiles (not its GEMVs), one token, routed experts alone,
    the outputs given (routing_outputs)."""
    if route is None:
        return
    if not (isinstance(tiles, MoeTiles) and not tiles.gemv):
        raise ValueError("fused_moe: routing in the gate|up launch runs on the first-generation split tiles")
    route.check(topk_ids.shape[1])
    if (topk_ids.shape[0] != 1 or shared is not None or alignment is None or not topk_ids.is_contiguous()
            or not topk_weights.is_contiguous()):
        raise ValueError("fused_moe: routing in the gate|up launch runs one token's routed experts alone, into "
                         "routing_outputs' buffers (topk_weights, topk_ids, alignment)")


def _check_shared(shared: SharedExpert | None, scales: MoeScales | None, w_gate: torch.Tensor, x: torch.Tensor):
    if shared is None:
        return
    if scales is not None:
        raise ValueError("the fused shared expert needs plain (unquantized) routed experts")
    for name, w in (("w_gate", shared.w_gate), ("w_up", shared.w_up), ("w_down", shared.w_down)):
        if w.dtype != w_gate.dtype or w.stride(-1) != 1:
            raise ValueError(f"shared {name} must be {w_gate.dtype} and contiguous along its last dim")
    if shared.w_gate.shape[1] != x.shape[1] or shared.w_down.shape != (x.shape[1], shared.inter):
        raise ValueError(f"shared expert shapes {tuple(shared.w_gate.shape)} / {tuple(shared.w_down.shape)} "
                         f"do not match hidden {x.shape[1]}")


def _launch_gate_up(x, wg, wu, inter, sorted_ids, block_expert, n_post, top_k, act, alpha, limit, tiles,
                    scales=None, shared: SharedExpert | None = None, routing: tuple | None = None):
    """The gate|up launch; routing: (KernelRoute, weights out, local ids out) when it routes the token itself."""
    from m3bench.runtime.kernels.moe_triton import moe_gate_up_kernel

    check_weights(x, wg, wu)
    n_inter, hidden = wg.shape[1], x.shape[1]
    sg, sge, sgn = scale_args(scales and scales.gate, wg)
    su, sue, sun = scale_args(scales and scales.up, wu)
    gg, gge = global_args(scales and scales.gate_global, wg)
    gu, gue = global_args(scales and scales.up_global, wu)
    fmt = expert_format(scales, wg)
    sb = _sub_block(fmt)
    n_routed = top_k * x.shape[0]
    n_all = n_routed + (x.shape[0] if shared is not None else 0)
    split = tiles.split_k  # split-K tiles: skinny_tiles (shared expert inside), routed_split_tiles, mx_split_tiles
    part = x.new_empty((split, n_all, 2 * n_inter), dtype=torch.float32) if split > 1 else inter
    ws = shared or SharedExpert(wg, wu, wg)  # dummies without a shared expert
    i_shared = shared.inter if shared is not None else 0
    n_tiles = math.ceil(n_inter / tiles.block_n) + math.ceil(i_shared / tiles.block_n)
    check_counters(block_expert.shape[0] * n_tiles, split)  # the kernel's N_T tiles a block
    grid = (block_expert.shape[0], gate_up_programs(n_inter, i_shared, split, tiles))
    moe_gate_up_kernel[grid](
        x, wg, wu, inter, sorted_ids, block_expert, n_post, n_all, alpha, limit,
        x.stride(0), wg.stride(0), wg.stride(1), wu.stride(0), wu.stride(1), inter.stride(0),
        sg, su, sge, sgn, sue, sun, gg, gu, gge, gue,
        n_routed, ws.w_gate, ws.w_up, ws.w_gate.stride(-2), ws.w_up.stride(-2), part,
        part.stride(0) if split > 1 else 0, part.stride(1) if split > 1 else 0,
        block_stride(wg, 3, sb), block_stride(wu, 3, sb), split_counters(x.device), *_route_args(routing, n_post),
        H=hidden, I=n_inter, TOPK=top_k, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, ACT=ACT_CODE[act], F32=x.dtype == torch.float32 or interpreting(),
        FMT=fmt, SHARED=shared is not None, E_R=wg.shape[0] if shared is not None else -1,
        I_S=i_shared, SPLIT=split,
        SPLIT_R=tiles.split_k_routed if split > 1 else 1, SB=sb, **_route_consts(routing, top_k, wg.shape[0]),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(x),
    )


def _route_args(routing: tuple | None, dummy: torch.Tensor) -> tuple:
    """The gate|up kernel's routing arguments (logits, bias, scale, first, weights out, ids out); dummies without."""
    if routing is None:
        return dummy, dummy, 0.0, 0, dummy, dummy
    route, w, ids = routing
    return (route.logits, route.logits if route.bias is None else route.bias, float(route.scale), int(route.first), w,
            ids)


def _route_consts(routing: tuple | None, top_k: int, n_local: int) -> dict:
    if routing is None:
        return {"ROUTE": False, "E_ALL": 1, "KP": 1, "HAS_BIAS": False, "E_LOCAL": 1}
    route = routing[0]
    return {"ROUTE": True, "E_ALL": route.logits.shape[1], "KP": next_pow2(top_k), "HAS_BIAS": route.bias is not None,
            "E_LOCAL": n_local}


def gate_up_programs(n_inter: int, n_shared_inter: int, split: int, tiles: MoeTiles) -> int:
    """Programs per M-block of the gate+up kernel: its N tiles, times the K chunks when split (routed
    and shared experts differ in both: the larger product)."""
    if split == 1:
        return math.ceil(n_inter / tiles.block_n)
    return max(math.ceil(n_inter / tiles.block_n) * tiles.split_k_routed,
               math.ceil(n_shared_inter / tiles.block_n) * split)


def _launch_down(inter, wd, n_rows, sorted_ids, block_expert, n_post, weights, tiles, scales=None,
                 shared: SharedExpert | None = None) -> torch.Tensor:
    """The down GEMM into its fp32 rows [chunks, n_rows, H] (one plane a K chunk, down_chunks), returned."""
    from m3bench.runtime.kernels.moe_triton import moe_down_kernel

    check_weights(wd)
    hidden, n_inter = wd.shape[1], inter.shape[1]
    sd, sde, sdn = scale_args(scales and scales.down, wd)
    gd, gde = global_args(scales and scales.down_global, wd)
    fmt = expert_format(scales, wd)
    sb = _sub_block(fmt)
    wsd = wd if shared is None else shared.w_down
    chunks, k_chunk = down_chunks(n_inter, tiles.split_down, tiles.block_k)
    y = inter.new_empty((chunks, n_rows, hidden), dtype=torch.float32)
    grid = (block_expert.shape[0], math.ceil(hidden / tiles.n_down), chunks)
    moe_down_kernel[grid](
        inter, wd, y, sorted_ids, block_expert, n_post, weights, n_rows,
        inter.stride(0), wd.stride(0), wd.stride(1), y.stride(1), y.stride(0), sd, sde, sdn, gd, gde,
        weights.shape[0], wsd, wsd.stride(-2), block_stride(wd, 3, sb),
        I=n_inter, H=hidden, BLOCK_M=tiles.block_m, BLOCK_N=tiles.n_down, BLOCK_K=tiles.block_k, K_CHUNK=k_chunk,
        F32=inter.dtype == torch.float32 or interpreting(), FMT=fmt,
        SHARED=shared is not None, E_R=wd.shape[0] if shared is not None else -1,
        I_S=shared.inter if shared is not None else 0, SB=sb,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(inter),
    )
    return y
