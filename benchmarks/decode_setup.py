"""Shared pieces of the decode benchmark: configs (one transformers config feeds both runtimes),
random KV contents, decode metadata, switching the fast path, CUDA-event / CUDA-graph timing."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from enum import Enum

import torch
from decode_floor import M3Shapes, layer_kinds, pages_per_seq

from m3bench.runtime.parallel import TPGroup


class SoloRank(TPGroup):
    """One rank of a TP/EP world run alone on one GPU: its share of every layer, collectives
    skipped (all-reduce: the local partial; all-gather: the local vocab slice of the logits).
    Feed it token ids of its own vocabulary slice: others embed to zeros without the all-reduce."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


class PaddedSoloRank(SoloRank):
    """SoloRank whose all-gather returns the full width, the other ranks' slices -inf (never picked: the
    rank's own vocabulary slice stays the only one sampled), for code sized by the full vocabulary (the
    speculative graphs' logits buffers); it writes what the real all-gather's output holds."""

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        pad = torch.full_like(x, float("-inf"))
        return torch.cat([x if r == self.rank else pad for r in range(self.world)], dim=dim)


def rank_model(s: M3Shapes, cfg, dtype: torch.dtype, dev: torch.device, backend, seed: int = 0,
               solo: type[SoloRank] = SoloRank):
    """The model one rank of s.world runs (rank 0), dummy weights; the index projection replicated."""
    from m3bench.runtime.model import M3ForCausalLM

    tp = solo(0, s.world) if s.world > 1 else None
    model = M3ForCausalLM(cfg, dtype=dtype, device=dev, tp=tp, backend=backend)
    for layer in model.layers:
        layer.attn.replicate_index_projection()
    model.init_dummy(seed)
    return model


def m3_hf_kwargs(s: M3Shapes, layers: int, max_pos: int) -> dict:
    """MiniMaxM3VLTextConfig keyword arguments of the full model whose rank has shapes s (world 1:
    s itself; also parsed by ModelConfig). Index heads are the full model's (replicated per rank)."""
    kinds, w = layer_kinds(s, layers), s.world
    return {
        "vocab_size": s.vocab * w, "hidden_size": s.hidden, "intermediate_size": s.expert_inter,
        "num_hidden_layers": layers, "num_attention_heads": s.heads * w, "num_key_value_heads": s.full_kv_heads,
        "head_dim": s.head_dim,
        "rotary_dim": s.rotary_dim, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                                      "partial_rotary_factor": s.rotary_dim / s.head_dim},
        "dense_intermediate_size": s.dense_inter * w, "shared_intermediate_size": s.shared_inter * w,
        "num_local_experts": s.router_experts, "num_experts_per_tok": s.top_k, "routed_scaling_factor": 2.0,
        "mlp_layer_types": ["sparse" if k else "dense" for k in kinds],
        "layer_types": ["minimax_m3_sparse" if k else "full_attention" for k in kinds],
        "index_n_heads": s.index_heads, "index_head_dim": s.index_dim, "index_block_size": s.page,
        "index_topk_blocks": s.topk_blocks, "index_local_blocks": 1, "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def hf_m3_config(s: M3Shapes, layers: int, max_pos: int):
    import transformers

    c = transformers.MiniMaxM3VLTextConfig(**m3_hf_kwargs(s, layers, max_pos))
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"
    c.architectures = ["MiniMaxM3VLForCausalLM"]
    return c


def our_config(hf_config):
    """The runtime's ModelConfig parsed from the same transformers config (one source of shapes)."""
    from m3bench.runtime.config import ModelConfig

    return ModelConfig.from_dict(hf_config.to_dict())


def qwen_config(tiny: bool):
    """Qwen2.5-0.5B shapes (or a tiny Qwen2 for the CPU smoke run)."""
    import transformers

    if tiny:
        kw = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 256}
    else:
        kw = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                  "num_key_value_heads": 2, "vocab_size": 151936}
    c = transformers.Qwen2Config(**kw, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6,
                                 bos_token_id=1, eos_token_id=2)
    c._attn_implementation = "eager" if tiny else "sdpa"
    c.architectures = ["Qwen2ForCausalLM"]
    return c


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def median_ms(fn, dev: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of fn(): CUDA events around each call on CUDA, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graphed(fn, dev: torch.device):
    """(fn captured in a CUDA graph after two eager runs on a side stream, True); (fn, False) on CPU
    or when capture fails (the failure is printed and the eager launches are timed instead)."""
    if dev.type != "cuda":
        return fn, False
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except RuntimeError as e:
        print(f"  CUDA graph capture failed ({str(e)[:160]}); timing eager launches", flush=True)
        torch.cuda.synchronize(dev)
        return fn, False
    return g.replay, True


def fill_random_(kv) -> None:
    """Random (finite) FP8 / bf16 contents in every K, V and index-key page."""
    g = torch.Generator(device=kv.k[0].data.device).manual_seed(0)
    for store in [*kv.k, *kv.v, *(s for s in kv.ik if s is not None)]:
        for chunk in store.data.split(max(1, (1 << 28) // max(1, store.data[0].numel())), dim=0):
            src = torch.randn(chunk.shape, generator=g, device=chunk.device, dtype=torch.bfloat16)
            chunk.copy_(src.to(chunk.dtype))


def decode_meta(s: M3Shapes, B: int, ctx: int, dev: torch.device):
    """Metadata of one decode token per sequence; sequence b owns pages b*n .. b*n+n-1."""
    from m3bench.runtime.attention.metadata import AttnMetadata

    n = pages_per_seq(s, ctx)
    tables = torch.arange(B * n, dtype=torch.int32, device=dev).view(B, n)
    pos = torch.full((B,), ctx, dtype=torch.int64, device=dev)
    slots = tables[:, ctx // s.page].long() * s.page + ctx % s.page
    return AttnMetadata(query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=dev),
                        seq_lens=torch.full((B,), ctx + 1, dtype=torch.int32, device=dev), block_tables=tables,
                        slot_mapping=slots, positions=pos, query_lens_host=[1] * B, seq_lens_host=[ctx + 1] * B)


class OpsSet(Enum):
    """Which fused ops the Triton fast path runs (the before / after sets of the benchmark); each set holds the
    ones before it."""

    UNFUSED = "unfused"  # Triton attention + fused routed MoE only, the rest in torch
    FUSED_V1 = "fused-v1"  # + norm/RoPE/KV write, residual add + norm, router epilogue (main before issue 12b)
    FUSED = "fused"  # + the shared expert inside the fused MoE (split-K for skinny batches), the router's
    #                  kernel aligning the picks (<= 16 tokens), the post-attention norm writing the router's
    #                  fp32 input, both norm/RoPE branches of an MSA layer in one launch, the dense MLP's
    #                  activation in one launch; fp16 FP8/NVFP4 KV
    #                  tiles are always on (no switch)
    SKINNY = "skinny"  # + the skinny decode GEMMs (kernels/skinny.py) for every plain linear at <= 16 rows and the
    #                    fp32 router at <= 4, gate|up GEMMs ending in their activation, the shared expert's down
    #                    GEMM adding the routed experts' sum (the runtime's default); programmatic dependent
    #                    launch off (kernels.backend.Pdl.OFF, whatever the runtime's default)
    SKINNY_PDL = "skinny-pdl"  # + every Triton kernel launched with PDL, the trigger after its wait (Pdl.ON)
    SKINNY_PDL_EARLY = "skinny-pdl-early"  # ... the trigger before its wait (Pdl.EARLY)
    SKINNY_PDL_SIDE = "skinny-pdl-side"  # skinny-pdl + the shared expert's gate|up on a side stream beside the
    #                                      router (SparseMoe.shared_beside GATE_UP, kernels/lanes.py)
    SKINNY_PDL_SIDE_WHOLE = "skinny-pdl-side-whole"  # ... its gate|up and down there, added in the routed sum (WHOLE,
    #                                                  the runtime's default); the routed experts unsplit
    HEADS = "skinny-pdl-side-whole-heads"  # + the q|k|v(|index) GEMM ending in its heads' norm / RoPE / cache write
    #                                        (Attention.fuse_qkv_heads, kernels/skinny_heads.py; off by default)
    INDEX = "skinny-pdl-side-whole-index"  # skinny-pdl-side-whole + the MSA index branch (its GEMM, norm / RoPE /
    #                                        write, block scores, top-k) on a side lane beside q|k|v (Attention.
    #                                        index_beside, up to 4 rows; off by default)
    HEADS_INDEX = "skinny-pdl-side-whole-heads-index"  # both: each lane's GEMM ending in its heads
    SPLIT = "skinny-pdl-side-whole-split"  # skinny-pdl-side-whole + the routed experts splitting K at one token
    #                                        (kernels.moe.ROUTED_SPLIT_TOKENS 1; every set before runs them unsplit,
    #                                        0, as timed before), their down GEMM whole (ROUTED_SPLIT_DOWN 1)
    DOWN2 = "skinny-pdl-side-whole-split-down2"  # ... their down GEMM's K in 2 chunks (ROUTED_SPLIT_DOWN 2), MXFP8
    #                                              experts at one token as GEMVs (ROUTED_GEMV_FMTS {1}; plain experts
    #                                              keep the split): the runtime's default until 2026-12-07
    #                                              (performance.md 2j, 2n; now SELECT_ROUTE, 2t)
    DOWN4 = "skinny-pdl-side-whole-split-down4"  # ... in 4 chunks
    SUM_NORM = "skinny-pdl-side-whole-split-down2-sumnorm"  # down2 + the fused MoE's final sum in the next residual
    #                                                         add + norm's launch (SparseMoe.sum_in_norm, one rank;
    #                                                         off by default: performance.md 2l)
    GEMV = "skinny-pdl-side-whole-split-down2-gemv"  # down2 + one token's plain routed experts as GEMVs too
    #                                                (kernels/moe_gemv.py, kernels.moe.ROUTED_GEMV_FMTS {0, 1})
    DOWN2_HEADS_INDEX = "skinny-pdl-side-whole-split-down2-heads-index"  # down2 + heads-index's two switches
    EVERY = "skinny-pdl-side-whole-split-down2-every"  # down2 + every switch that is off by default: the fused heads,
    #                                                   the index branch beside, the sum in the norm, the GEMVs
    SELECT = "skinny-pdl-side-whole-split-down2-select"  # down2 + the MSA top-k in the attention launch (TritonBackend.
    #                                                      select_in_attention, msa_index.BlockScores)
    ROUTE = "skinny-pdl-side-whole-split-down2-route"  # down2 + one token routed in the experts' gate|up launch
    #                                                    (SparseMoe.route_in_experts, router.KernelRoute)
    SELECT_ROUTE = "skinny-pdl-side-whole-split-down2-select-route"  # both: the runtime's (2026-12-07)

    @classmethod
    def runtime(cls) -> "OpsSet":
        """The set the runtime runs by default (every default switch as the runtime leaves it)."""
        return cls.SELECT_ROUTE

    def holds(self, other: "OpsSet") -> bool:
        order = list(OpsSet)
        return order.index(self) >= order.index(other)


# the sets that turn on each switch that is off by default (set_ops)
HEADS_SETS = frozenset({OpsSet.HEADS, OpsSet.HEADS_INDEX, OpsSet.DOWN2_HEADS_INDEX, OpsSet.EVERY})
INDEX_SETS = frozenset({OpsSet.INDEX, OpsSet.HEADS_INDEX, OpsSet.DOWN2_HEADS_INDEX, OpsSet.EVERY})
SUM_NORM_SETS = frozenset({OpsSet.SUM_NORM, OpsSet.EVERY})
SELECT_SETS = frozenset({OpsSet.SELECT, OpsSet.SELECT_ROUTE})
ROUTE_SETS = frozenset({OpsSet.ROUTE, OpsSet.SELECT_ROUTE})
# the expert formats (kernels.moe.ROUTED_GEMV_FMTS) whose routed experts run one token as GEMVs: MXFP8 in the runtime's
# set and those built on it, as the runtime does; plain ones too in the GEMV sets; none in the sets before (as timed)
GEMV_FMTS = {OpsSet.DOWN2: frozenset({1}), OpsSet.SUM_NORM: frozenset({1}), OpsSet.DOWN2_HEADS_INDEX: frozenset({1}),
             OpsSet.GEMV: frozenset({0, 1}), OpsSet.EVERY: frozenset({0, 1}), OpsSet.SELECT: frozenset({1}),
             OpsSet.ROUTE: frozenset({1}), OpsSet.SELECT_ROUTE: frozenset({1})}
# the routed experts' K split at one token: the down GEMM's chunks (kernels.moe.ROUTED_SPLIT_DOWN) of each split set
SPLIT_DOWN = {OpsSet.SPLIT: 1, OpsSet.DOWN2: 2, OpsSet.DOWN4: 4, OpsSet.SUM_NORM: 2, OpsSet.GEMV: 2,
              OpsSet.DOWN2_HEADS_INDEX: 2, OpsSet.EVERY: 2, OpsSet.SELECT: 2, OpsSet.ROUTE: 2, OpsSet.SELECT_ROUTE: 2}


def pdl_of(ops: OpsSet):
    """The PDL mode (kernels.backend.Pdl) an ops set runs its Triton kernels with."""
    from m3bench.runtime.kernels.backend import Pdl

    if ops is OpsSet.SKINNY_PDL_EARLY:
        return Pdl.EARLY
    return Pdl.ON if ops.holds(OpsSet.SKINNY_PDL) else Pdl.OFF


def beside_of(ops: OpsSet):
    """Where an ops set runs the shared expert below the fused MoE's threshold (layers.moe.SharedBeside)."""
    from m3bench.runtime.layers.moe import SharedBeside

    if ops is OpsSet.SKINNY_PDL_SIDE:
        return SharedBeside.GATE_UP
    return SharedBeside.WHOLE if ops.holds(OpsSet.SKINNY_PDL_SIDE_WHOLE) else SharedBeside.OFF


@contextmanager
def pdl_mode(mode=None):
    """Inside: the process-wide PDL switch (kernels.backend.PDL) set to `mode` (None: left as it is, though set_ops
    may change it); restored after, with the routed experts' split (kernels.moe.ROUTED_SPLIT_TOKENS, ROUTED_SPLIT_DOWN)
    and GEMVs (ROUTED_GEMV_FMTS) set_ops may change too."""
    from m3bench.runtime.kernels.backend import PDL

    from m3bench.runtime.kernels import moe

    before, split, down, gemv = PDL["launch"], moe.ROUTED_SPLIT_TOKENS, moe.ROUTED_SPLIT_DOWN, moe.ROUTED_GEMV_FMTS
    if mode is not None:
        PDL["launch"] = mode
    try:
        yield
    finally:
        PDL["launch"], moe.ROUTED_SPLIT_TOKENS, moe.ROUTED_SPLIT_DOWN, moe.ROUTED_GEMV_FMTS = before, split, down, gemv


def set_ops(model, ops: OpsSet) -> None:
    """Switch the model's fast path to the fused ops of `ops` (TritonBackend.fuse_ops / select_in_attention,
    SparseMoe's fuse_router / fuse_shared / fuse_align / fuse_router_input / shared_beside, Attention.fuse_branches /
    fuse_qkv_heads / index_beside, GatedMLP.fuse_act, SparseMoe.sum_in_norm / route_in_experts,
    the layers' skinny_rows) and the process to its PDL mode and routed-expert split (kernels.backend.PDL,
    kernels.moe.ROUTED_SPLIT_TOKENS, ROUTED_SPLIT_DOWN, ROUTED_GEMV_FMTS; pdl_mode() restores them)."""
    from m3bench.runtime.kernels import moe as moe_kernels
    from m3bench.runtime.kernels.backend import PDL
    from m3bench.runtime.kernels.skinny import SKINNY_MAX_ROWS
    from m3bench.runtime.layers.linear import set_skinny_rows
    from m3bench.runtime.layers.moe import SparseMoe

    fused, fused_v1 = ops.holds(OpsSet.FUSED), ops.holds(OpsSet.FUSED_V1)
    PDL["launch"] = pdl_of(ops)
    moe_kernels.ROUTED_SPLIT_TOKENS = 1 if ops in SPLIT_DOWN else 0
    moe_kernels.ROUTED_SPLIT_DOWN = SPLIT_DOWN.get(ops, 1)
    moe_kernels.ROUTED_GEMV_FMTS = GEMV_FMTS.get(ops, frozenset())
    if hasattr(model.backend, "fuse_ops"):
        model.backend.fuse_ops = fused_v1
    if hasattr(model.backend, "select_in_attention"):
        model.backend.select_in_attention = ops in SELECT_SETS
    set_skinny_rows(model, SKINNY_MAX_ROWS if ops.holds(OpsSet.SKINNY) else 0)
    for layer in model.layers:
        layer.attn.fuse_branches = fused
        layer.attn.fuse_qkv_heads = ops in HEADS_SETS
        layer.attn.index_beside = ops in INDEX_SETS
        if hasattr(layer.mlp, "fuse_act"):  # the dense MLP
            layer.mlp.fuse_act = fused
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.fuse_router = fused_v1
            layer.mlp.fuse_shared = layer.mlp.fuse_align = layer.mlp.fuse_router_input = fused
            layer.mlp.shared_beside = beside_of(ops)
            layer.mlp.sum_in_norm = ops in SUM_NORM_SETS
            layer.mlp.route_in_experts = ops in ROUTE_SETS
            if layer.mlp.shared is not None:
                layer.mlp.shared.fuse_act = ops.holds(OpsSet.SKINNY)


def set_fast_path(model, on: bool) -> None:
    """Triton attention + fused MoE + skinny decode GEMMs (on) or the torch backend + torch MoE + cuBLAS (off,
    the reference)."""
    from m3bench.runtime.attention.torch_backend import TorchBackend
    from m3bench.runtime.attention.triton_backend import TritonBackend
    from m3bench.runtime.kernels.backend import KernelBackend
    from m3bench.runtime.kernels.skinny import SKINNY_MAX_ROWS
    from m3bench.runtime.layers.linear import set_skinny_rows
    from m3bench.runtime.layers.moe import SparseMoe

    model.backend = TritonBackend() if on else TorchBackend()
    set_skinny_rows(model, SKINNY_MAX_ROWS if on else 0)
    for layer in model.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON if on else KernelBackend.TORCH


# ---- the engine of an LLM, run synchronously and with overlap scheduling ---------------------------------


def engine_variants(llm, overlap_cls=None) -> dict:
    """The LLM's engine parts (runner, graphs, pool) behind a synchronous Engine and an overlapped one
    (or `overlap_cls(*args)`, an Engine subclass that overlaps)."""
    from m3bench.runtime.engine import Engine

    e = llm.engine
    args = (e.runner, e.scheduler, e.sampler, e.tokenizer, tuple(e.eos), e.max_model_len)
    kw = {"spec": e.spec}  # speculation (None without a draft) is the loop's strategy under both
    return {"sync": Engine(*args, **kw), "async": overlap_cls(*args, **kw) if overlap_cls else Engine(*args, overlap=True, **kw)}


def engine_step_ms(outputs) -> float:
    """Median over requests of the host time between consecutive tokens (one decode step each)."""
    gaps = [(t[-1] - t[0]) / (len(t) - 1) * 1e3 for t in (o.timings.token_s for o in outputs) if len(t) > 1]
    return statistics.median(gaps) if gaps else float("nan")


def replay_ms(llm, batch: int, dev: torch.device) -> float:
    """The captured decode graph of the size serving `batch` requests, replayed alone (no host work)."""
    graphs = llm.engine.runner.graphs
    if graphs is None:
        return float("nan")
    size = next(b for b in graphs.sizes if b >= batch)
    return median_ms(graphs.graphs[size].replay, dev, 3, 20)
