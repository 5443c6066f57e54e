"""MoE block: fp32 sigmoid router with correction bias, stacked routed experts, ungated shared expert.

Router: s = sigmoid(x Wg^T); top-k by s + bias; weights = the chosen unbiased s renormalised to
sum 1, times routed_scaling_factor. moe(x) = sum_k w_k expert_k(x) + shared(x), one all-reduce.
Experts are stacked parameters: gate|up `[E, 2 I, H]` (gate rows first), down `[E, H, I]`.

Under TP the routed experts are expert-parallel: rank r owns experts [r E/N, (r+1) E/N) whole, and
the shared expert is split by intermediate size. No tokens are exchanged: attention is tensor-
(not data-) parallel, so every rank already holds every token's hidden state; each runs the router
(replicated), its own experts on the assignments routed to them (others' ids fall outside its local
range and contribute nothing), and the one all-reduce that sums the shared expert's row-parallel
partials also combines the experts' outputs. Under attention data parallelism (`ep` given, the rest
replicated) ranks hold different tokens: `exchange` (layers/moe_exchange.py) takes them to the experts'
owners and back. On CUDA the routed experts run as one fused Triton MoE (`kernels.moe.fused_moe`:
no host reads, CUDA-graph safe), the shared expert inside it as one more expert (`fuse_shared`, from
FUSE_SHARED_FROM_TOKENS tokens; not with `exchange`); the torch path (tokens grouped by expert with a
sort, counts read on the host) stays for CPU and float64 and is the reference. `kernel_backend` forces either one.
Below FUSE_SHARED_FROM_TOKENS the shared expert runs on its own, on a side stream beside the router's chain
(`shared_beside`, SharedBeside; kernels/lanes.py).
Built under `linear_format(LinearFormat.MXFP8)` the experts are float8_e4m3fn with E8M0 scales
(`w_gate_up_scale` [E, 2 I, H/32], `w_down_scale` [E, H, I/32]); under NVFP4_EXPERTS they are packed E2M1
(uint8 [E, 2 I, H/2], [E, H, I/2]) with e4m3 scales per 16 inputs and fp32 globals per row
(`w_gate_up_global` [E, 2 I], `w_down_global` [E, H]). The fused MoE dequantizes in registers, the torch
path expert by expert.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn

from m3bench.runtime import quant
from m3bench.runtime.config import Activation, MoeConfig
from m3bench.runtime.kernels.backend import KernelBackend, use_triton
from m3bench.runtime.kernels.lanes import SideLane
from m3bench.runtime.kernels.moe import (
    SKINNY_TOKENS,
    MoeActivation,
    MoeAlignment,
    MoeScales,
    MoeTiles,
    SharedExpert,
    expert_format,
    first_generation,
    first_generation_tiles,
    fused_moe,
)
from m3bench.runtime.kernels.moe_sum import MoeSum
from m3bench.runtime.kernels.router import (
    KernelRoute,
    router_align_supported,
    router_topk,
    router_topk_align,
    router_topk_supported,
    routing_outputs,
)
from m3bench.runtime.layers.activation import split_gate_up
from m3bench.runtime.layers.linear import SKINNY_ROWS, WeightSlot, linear
from m3bench.runtime.layers.mlp import GatedMLP
from m3bench.runtime.layers.norm import compute_dtype
from m3bench.runtime.layers.weight_format import current_linear_format, mx_params, nv_params
from m3bench.runtime.parallel import SINGLE, TPGroup

# The shared expert joins the fused MoE from this many tokens. Below it (kernels.moe.SKINNY_TOKENS) it would run
# the split-K skinny path, which the H200 profile of one TP8/EP8 rank's MSA+MoE layer at batch 1 (2026-12-02,
# benchmarks/decode_step.py --profile) found slower than its own cuBLAS GEMMs: all-local 224.6 us against 191.0
# (gate+up 76.9 / 70.8 us, down 61.1 / 36.8, the partial-summing activation 27.1), realistic 83.5 / 83.4.
FUSE_SHARED_FROM_TOKENS = SKINNY_TOKENS + 1


class SharedBeside(Enum):
    """Where a shared expert that runs on its own (below FUSE_SHARED_FROM_TOKENS) goes, on CUDA (kernels/lanes.py)."""

    OFF = "off"  # after the routed experts, on the main stream; its down GEMM adds their sum in its epilogue
    GATE_UP = "gate-up"  # its gate|up on the side stream beside the router's chain; the down GEMM as OFF (same bits)
    WHOLE = "whole"  # gate|up and down on the side stream; the routed experts' final sum adds its output (fp32)


# The default. H200, 60-layer TP8/EP8 rank decode step at 8k (benchmarks/decode_step.py --ops-sets skinny-pdl
# skinny-pdl-side skinny-pdl-side-whole, 2026-12-04): B1 realistic 4.604 / 4.422 / 4.331 ms, B4 realistic 7.333 /
# 7.036 / 6.927, B1 all-local 9.817 / 9.518 / 9.533; B16 and B64 unchanged (the shared expert is fused there).
SHARED_BESIDE = SharedBeside.WHOLE
# One rank (no all-reduce after the MoE): the fused MoE's final sum runs inside the next residual add + norm's launch
# (kernels/moe_sum.py; the same bits, a launch fewer a MoE layer). Under TP the sum stays before the all-reduce (a
# deployment fuses it there: TensorRT-LLM's MoE finalize + all-reduce + add + norm). Off: the H100's 37-layer rank step
# did not gain (2026-12-06, performance.md 2l: B1 realistic 2.882 / 2.879 ms, B4 5.125 / 5.108; MXFP8 60 layers B1
# 8.329 / 8.377); an H200 has not run it.
SUM_IN_NORM = False
# One token whose routed experts run the first generation's tiles (plain experts at B1: the split tiles; the shared
# expert beside): the fused MoE's gate|up launch routes the token itself from the router's logits (kernels.router.
# KernelRoute), the router's top-k + align launch left out. On: a 37-layer H100 rank step (2026-12-07, docs/
# performance.md 2t) B1 realistic 2.853 -> 2.813 ms alone, 2.777 with the MSA top-k in the attention launch; B4 within
# 0.3%. The MXFP8 GEMVs keep the router's launch: routing in them was 1.5% slower at B1 (60 MXFP8 layers, 2t).
ROUTE_IN_EXPERTS = True


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int,
          scale: float, backend: KernelBackend = KernelBackend.TORCH, x_router: torch.Tensor | None = None,
          skinny_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (weights [T, k] in the router's dtype, expert ids [T, k] int64); the epilogue after
    the GEMM runs as one Triton kernel (kernels.router) when the backend picks Triton. x_router: x
    already in the router's dtype (SparseMoe.router_input), else x is cast. skinny_rows: layers.linear.linear's."""
    logits = linear(router_logits_input(x, weight, x_router), weight, None, skinny_rows=skinny_rows)
    if use_triton(backend, logits) and router_topk_supported(logits, top_k):
        return router_topk(logits, bias, top_k, scale)
    s = torch.sigmoid(logits)
    choice = s if bias is None else s + bias
    ids = choice.topk(top_k, dim=-1).indices
    w = s.gather(1, ids)
    return w / w.sum(-1, keepdim=True) * scale, ids


def router_logits_input(x: torch.Tensor, weight: torch.Tensor, x_router: torch.Tensor | None) -> torch.Tensor:
    return x.to(weight.dtype) if x_router is None else x_router


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """ids [T, k] -> (order over T*k assignments sorted by expert, their token index, count per expert)."""
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # host sync: torch path only
    return order, order // ids.shape[1], counts


def _expert_params(shape: tuple[int, int, int], dtype: torch.dtype, device) -> tuple:
    """Stacked expert (weights, scales, per-row global scales) in the current format (None where it has none)."""
    fmt = current_linear_format()
    if fmt.experts_nvfp4:
        return nv_params(shape, device)
    if fmt.linears_mxfp8:
        return (*mx_params(shape, device), None)
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), False), None, None


class SparseMoe(nn.Module):
    def __init__(self, hidden: int, m: MoeConfig, act: Activation, alpha: float, limit: float,
                 dtype: torch.dtype, device, tp: TPGroup = SINGLE, ep: TPGroup | None = None):
        super().__init__()
        self.m, self.act, self.alpha, self.limit, self.tp, self.dtype = m, act, alpha, limit, tp, dtype
        self.ep = ep or tp  # the ranks the routed experts are split over (attention DP: ep, with tp SINGLE)
        self.exchange = None  # attention DP: the ExpertExchange every rank's tokens go through
        self.kernel_backend = KernelBackend.AUTO  # AUTO: fused Triton MoE on CUDA, torch elsewhere
        self.fuse_router = True  # the router epilogue follows kernel_backend (off: always torch)
        self.fuse_shared = True  # the shared expert inside the fused MoE's launches (plain weights; off: its own GEMMs)
        self.fuse_shared_from_tokens = FUSE_SHARED_FROM_TOKENS  # fewer tokens: the shared expert's own GEMMs
        self.fuse_align = True  # <= 16 tokens: the router epilogue also aligns the picks for the fused MoE (one launch)
        self.fuse_router_input = True  # the post-attention add + norm also writes the router's fp32 input (no cast)
        self.shared_beside = SHARED_BESIDE  # the shared expert (not fused) beside the router: SharedBeside
        self.sum_in_norm = SUM_IN_NORM  # one rank: the fused MoE's sum in the next add + norm's launch (forward's defer_sum)
        self.route_in_experts = ROUTE_IN_EXPERTS  # one token: the router's top-k in the experts' gate|up launch
        self.skinny_rows = SKINNY_ROWS  # the router GEMM at up to this many rows: kernels.skinny (layers.linear)
        inter = m.intermediate_size  # routed experts are whole on their rank (expert parallelism)
        self.first_expert, local = self.ep.expert_range(m.num_experts)
        rdt = compute_dtype(dtype)
        self.router_weight = nn.Parameter(torch.empty(m.num_experts, hidden, dtype=rdt, device=device), False)
        self.router_bias = (nn.Parameter(torch.empty(m.num_experts, dtype=rdt, device=device), False)
                            if m.use_routing_bias else None)
        self.w_gate_up, self.w_gate_up_scale, self.w_gate_up_global = _expert_params((local, 2 * inter, hidden),
                                                                                     dtype, device)
        self.w_down, self.w_down_scale, self.w_down_global = _expert_params((local, hidden, inter), dtype, device)
        self.shared = (GatedMLP(hidden, m.shared_intermediate_size, act, alpha, limit, dtype, device, tp,
                                reduce=False) if m.shared_intermediate_size else None)

    def forward(self, x: torch.Tensor, x_router: torch.Tensor | None = None, defer_sum: bool = False
                ) -> torch.Tensor | MoeSum:
        """x [T, H] -> [T, H]; x_router: x in the router's dtype when the caller has it (router_input); defer_sum: the
        caller takes the fused MoE's partials unsummed where `sum_in_norm` and one rank allow (kernels/moe_sum.py)."""
        if self.exchange is None and self.align_fusable(x):
            y = self.routed_and_aligned(x, x_router, defer_sum and self.sum_in_norm and self.tp.world == 1)
            return y if isinstance(y, MoeSum) else self.tp.all_reduce(y).to(x.dtype)
        w, ids = route(x, self.router_weight, self.router_bias, self.m.top_k, self.m.routed_scaling_factor,
                       self.kernel_backend if self.fuse_router else KernelBackend.TORCH, x_router, self.skinny_rows)
        local = ids - self.first_expert if self.first_expert else ids  # local expert ids
        if self.exchange is not None:  # attention DP: every rank's tokens meet the experts' owners
            y = self.exchange.dispatch(self, x, w, ids)
        elif self.shared_fusable(x):
            return self.tp.all_reduce(self.fused_experts(x, w, local, self.shared_expert())).to(x.dtype)
        else:
            y = self.experts(x, w, local)
        if self.shared is not None:
            y = self.shared_added(x, y)
        return self.tp.all_reduce(y).to(x.dtype)

    def shared_added(self, x: torch.Tensor, y: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """y + the shared expert of x (the add in its down GEMM's epilogue where that can run it); h: its gate|up
        activation when already made beside the router (routed_and_aligned, SharedBeside.GATE_UP)."""
        if h is None:  # the whole shared expert here
            return (self.shared(x, self.kernel_backend, add=y) if y.dtype == x.dtype
                    else y + self.shared(x, self.kernel_backend).to(y.dtype))
        return self.shared.down(h, add=y) if y.dtype == x.dtype else y + self.shared.down(h).to(y.dtype)

    def align_fusable(self, x: torch.Tensor) -> bool:
        """The router's kernel aligns the picks too: switched on with the fused router, experts on the fused MoE's
        first-generation kernels, few tokens."""
        return (self.fuse_align and self.fuse_router and x.dtype != torch.float64 and use_triton(self.kernel_backend, x)
                and self.router_weight.dtype == torch.float32 and self.first_generation_experts()
                and router_align_supported(x.shape[0], self.m.num_experts, self.m.top_k))

    def router_input(self, like: torch.Tensor, backend: KernelBackend) -> torch.Tensor | None:
        """An fp32 buffer for the post-attention norm to write the router's input into (fused path, low-precision
        activations: saves the cast launch), else None."""
        if not (self.fuse_router_input and self.fuse_router and use_triton(backend, like)
                and use_triton(self.kernel_backend, like) and like.dtype in (torch.bfloat16, torch.float16)
                and self.router_weight.dtype == torch.float32):
            return None
        return torch.empty(like.shape, dtype=torch.float32, device=like.device)

    def routed_and_aligned(self, x: torch.Tensor, x_router: torch.Tensor | None = None, defer_sum: bool = False
                           ) -> torch.Tensor | MoeSum:
        """route + fused experts (+ the shared expert when fusable) with the alignment made by the router's kernel;
        defer_sum: the partials unsummed (MoeSum) where the fused MoE's sum is the layer's last launch."""
        shared = self.shared_expert() if self.shared_fusable(x) else None
        tiles = self.expert_tiles(x, shared)
        beside = SharedBeside.OFF if shared is not None or self.shared is None else self.shared_beside
        with SideLane(x, on=beside is not SharedBeside.OFF) as side:  # beside the router's chain
            part = (self.shared(x, self.kernel_backend) if beside is SharedBeside.WHOLE
                    else self.shared.activated(x, self.kernel_backend) if beside is SharedBeside.GATE_UP else None)
        logits = linear(router_logits_input(x, self.router_weight, x_router), self.router_weight, None,
                        skinny_rows=self.skinny_rows)
        w, ids, alignment, route = self.routing(logits, tiles, shared is not None)
        if beside is SharedBeside.WHOLE:
            def joined() -> torch.Tensor:  # right before the routed sum's launch
                side.join(part)
                return part

            return self.fused_experts(x, w, ids, shared, alignment, tiles, add=joined, defer_sum=defer_sum,
                                      route=route)
        last = shared is not None or self.shared is None  # no shared expert's down GEMM after the sum
        y = self.fused_experts(x, w, ids, shared, alignment, tiles, defer_sum=defer_sum and last, route=route)
        side.join(part)
        return y if last else self.shared_added(x, y, part)

    def routing(self, logits: torch.Tensor, tiles: MoeTiles, shared: bool) -> tuple:
        """(weights, local ids, alignment, KernelRoute | None) for routed_and_aligned: made now by the router's kernel,
        or (route_in_experts, one token on the first generation's tiles, no shared expert inside) buffers that the
        fused MoE's gate|up launch fills from the KernelRoute."""
        n_local, top_k = self.w_down.shape[0], self.m.top_k
        if self.route_in_experts and logits.shape[0] == 1 and not shared and not tiles.gemv:
            return (*routing_outputs(1, top_k, n_local, tiles.block_m, False, logits.device),
                    KernelRoute(logits, self.router_bias, self.m.routed_scaling_factor, self.first_expert))
        return (*router_topk_align(logits, self.router_bias, top_k, self.m.routed_scaling_factor, self.first_expert,
                                   n_local, tiles.block_m, shared), None)

    def expert_tiles(self, x: torch.Tensor, shared: SharedExpert | None) -> MoeTiles:
        """The fused MoE's tiles for x [T, H]: what fused_moe picks for first-generation experts (the only ones the
        router kernel aligns for, align_fusable)."""
        return first_generation_tiles(x.shape[0], self.m.top_k, self.w_down.shape[0], self.w_gate_up.shape[1] // 2,
                                      x.shape[1], self.w_down_scale is not None, shared.inter if shared else 0,
                                      expert_format(self.expert_scales(), self.w_gate_up))

    def first_generation_experts(self) -> bool:
        """The fused MoE runs these experts on its first-generation kernels (plain weights, or quantized ones it
        picks them for: kernels.moe.first_generation), which take the router kernel's alignment and an add; NVFP4
        experts run the tile-dequantizing kernels (~7x faster at decode, docs/performance.md 9), which do not."""
        scales = self.expert_scales()
        return scales is None or first_generation(scales, self.w_gate_up)

    def shared_fusable(self, x: torch.Tensor) -> bool:
        """The shared expert runs inside the fused MoE: switched on, Triton, plain routed and shared weights."""
        s = self.shared
        return (self.fuse_shared and s is not None and x.shape[0] >= self.fuse_shared_from_tokens
                and x.dtype != torch.float64 and use_triton(self.kernel_backend, x)
                and self.w_down_scale is None and s.gate_up.weight_scale is None and s.down.weight_scale is None
                and s.gate_up.bias is None and s.down.bias is None)

    def shared_expert(self) -> SharedExpert:
        """Views of the shared expert's (this rank's slice of the) weights as the fused MoE takes them."""
        gu, inter = self.shared.gate_up.weight, self.shared.gate_up.local_sizes[0]
        return SharedExpert(gu[:inter], gu[inter:], self.shared.down.weight)

    def experts(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Routed experts' weighted sum [T, H], accumulated in fp32 (fp64 for fp64 models)."""
        if x.dtype != torch.float64 and use_triton(self.kernel_backend, x):
            return self.fused_experts(x, w, ids)
        return self.torch_experts(x, w, ids)

    def fused_experts(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, shared: SharedExpert | None = None,
                      alignment: MoeAlignment | None = None, tiles: MoeTiles | None = None, add=None,
                      defer_sum: bool = False, route: KernelRoute | None = None) -> torch.Tensor | MoeSum:
        """The fused Triton MoE (fp32 accumulation inside; result in x's dtype), the shared expert in it when given,
        + add (kernels.moe.fused_moe's) in its final sum (left unlaunched with defer_sum: MoeSum); route: the token
        routed in its gate|up launch (w, ids, alignment: the buffers it fills)."""
        inter = self.w_gate_up.shape[1] // 2
        return fused_moe(x.contiguous(), self.w_gate_up[:, :inter], self.w_gate_up[:, inter:], self.w_down,
                         ids, w, MoeActivation(self.act.value), self.alpha, self.limit,
                         backend=KernelBackend.TRITON, tiles=tiles, scales=self.expert_scales(), shared=shared,
                         alignment=alignment, add=add, defer_sum=defer_sum, route=route)

    def expert_scales(self) -> MoeScales | None:
        """The experts' block scales as the fused MoE takes them (None: plain weights)."""
        if self.w_down_scale is None:
            return None
        inter, gu, g = self.w_gate_up.shape[1] // 2, self.w_gate_up_scale, self.w_gate_up_global
        if g is None:
            return MoeScales(gu[:, :inter], gu[:, inter:], self.w_down_scale)
        return MoeScales(gu[:, :inter], gu[:, inter:], self.w_down_scale, g[:, :inter], g[:, inter:],
                         self.w_down_global)

    def expert_weights(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Local expert e's (gate|up [2I, H], down [H, I]) in dtype (dequantized when quantized)."""
        if self.w_down_scale is None:
            return self.w_gate_up[e], self.w_down[e]
        if self.w_down_global is None:
            return (quant.dequant_mxfp8(self.w_gate_up[e], self.w_gate_up_scale[e], dtype),
                    quant.dequant_mxfp8(self.w_down[e], self.w_down_scale[e], dtype))
        return (quant.dequant_nvfp4(self.w_gate_up[e], self.w_gate_up_scale[e], self.w_gate_up_global[e], dtype),
                quant.dequant_nvfp4(self.w_down[e], self.w_down_scale[e], self.w_down_global[e], dtype))

    def torch_experts(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Reference path: tokens grouped by expert with a sort (reads expert counts on the host); ids
        outside [0, E local) are other ranks' experts and are skipped."""
        num_local = self.w_down.shape[0]
        ids = torch.where((ids >= 0) & (ids < num_local), ids, num_local)  # others': one bucket past the end
        order, tok, counts = group_by_expert(ids, num_local + 1)
        mine = sum(counts[:num_local])
        order, tok = order[:mine], tok[:mine]
        xs = x[tok]
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts[:num_local]):
            if n:
                w_gate_up, w_down = self.expert_weights(e, x.dtype)
                h = split_gate_up(xs[start:start + n] @ w_gate_up.T, self.act, self.alpha, self.limit)
                out[start:start + n] = h @ w_down.T
                start += n
        acc = compute_dtype(x.dtype)
        out = out.to(acc) * w.flatten()[order].to(acc)[:, None]
        return torch.zeros(x.shape, dtype=acc, device=x.device).index_add_(0, tok, out)

    def slots(self, prefix: str) -> list[WeightSlot]:
        out = [WeightSlot(f"{prefix}router.weight", self.router_weight, None)]
        if self.router_bias is not None:
            out.append(WeightSlot(f"{prefix}router.bias", self.router_bias, None))
        inter = self.w_gate_up.shape[1] // 2
        gate, up, every = slice(0, inter), slice(inter, 2 * inter), slice(None)
        for e in range(self.w_down.shape[0]):  # this rank's experts only, each whole
            p = f"{prefix}experts.{self.first_expert + e}."
            out += [self._slot(f"{p}gate_proj.weight", self.w_gate_up, self.w_gate_up_scale, self.w_gate_up_global,
                               e, gate),
                    self._slot(f"{p}up_proj.weight", self.w_gate_up, self.w_gate_up_scale, self.w_gate_up_global,
                               e, up),
                    self._slot(f"{p}down_proj.weight", self.w_down, self.w_down_scale, self.w_down_global, e, every)]
        if self.shared is not None:
            out += self.shared.slots(f"{prefix}shared.")
        return out

    @staticmethod
    def _slot(name: str, w, scale, glob, e: int, rows: slice) -> WeightSlot:
        """Rows of local expert e of a stacked weight (with its scales where quantized)."""
        pick = (lambda t: None if t is None else t[e, rows])  # noqa: E731
        return WeightSlot(name, w[e, rows], None, scale=pick(scale), scale_2=pick(glob))
