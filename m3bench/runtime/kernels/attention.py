"""Paged attention entry point for the model: Triton on CUDA, the torch reference on CPU.

    out = paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                          scale, selected_blocks=None, max_query_len=16)

q [T, Hq, d]; k_cache / v_cache [pages, Hkv, P, d] bf16/fp16/fp32/float8_e4m3fn, or
Nvfp4Pages (the format is taken from the cache objects); selected_blocks [T, Hkv, topk] int32
(-1 padded) restricts each token to those blocks (MSA, page == sparse block); a msa_index.BlockScores
[T, Hkv, width] instead: to the top-k blocks of those scores, selected in the attention kernel.
max_query_len is a static upper bound of the per-request query lengths (a CUDA-graph-safe
launch size); None reads it from query_start_loc on the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels import reference
from m3bench.runtime.kernels.backend import (
    FMT_CODE,
    WHOLE_PAGE_ROWS,
    KernelBackend,
    cache_kernel_args,
    interpreting,
    next_pow2,
    nvfp4_asm,
    pdl_args,
    prev_pow2,
    scale_row_strides,
    target_programs,
    use_triton,
)
from m3bench.runtime.kernels.kv_quant import KVFormat, PagedTensor, kv_format_of
from m3bench.runtime.kernels.msa_index import BlockScores, selection_args

MAX_SEGMENTS = 128
MIN_TILES_PER_SEGMENT = 4
TILE_BY_PROGRAMS = {False: ((16, 128), (4, 64)), True: ((64, 128), (32, 64))}  # (dense | sparse): (programs, keys)
#   before splitting: fewer programs split the keys over more segments, and shorter steps win there. Measured on
#   the H200 (performance.md 2d): whole pages 0.78-0.92x the 64-key step's time from 16 programs (dense) / 64
#   (MSA), 32 keys 0.9-0.97x at 1 program; 32 keys otherwise
FEW_PROGRAMS = 4  # at most this many programs before splitting (decode at batch 1-4 with one KV head a rank):
FEW_TILE = {False: 64, True: 128}  # keys a step (dense | sparse), and one step a segment. H200, 8k, FP8 KV
#   (benchmarks/attn_segments.py, performance.md 2f), us with the merge: MSA B1 9.20 (32 keys x 16 segments, 4 steps
#   each) -> 6.51, B4 9.41 -> 6.87; dense B1 10.43 (32 x 64) -> 7.02, B4 13.79 (64 x 32) -> 12.03


@dataclass(frozen=True)
class AttnLaunch:
    """Launch shape of one paged-attention call (all from static bounds)."""

    block_m: int
    block_q: int
    n_qblk: int
    tile: int
    n_seg: int


def paged_attention(
    q: torch.Tensor,
    k_cache: PagedTensor,
    v_cache: PagedTensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    selected_blocks: torch.Tensor | BlockScores | None = None,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    backend: KernelBackend = KernelBackend.AUTO,
    num_segments: int | None = None,
    tile: int | None = None,
) -> torch.Tensor:
    """Causal paged GQA attention over each token's own prefix (or its selected blocks)."""
    if not use_triton(backend, q):
        if isinstance(selected_blocks, BlockScores):
            raise ValueError("paged_attention: block scores are selected by the Triton kernel only")
        return reference.paged_attention_ref(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, selected_blocks, out
        )
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    out = torch.empty_like(q) if out is None else out
    launch = plan_attention(q, k_cache, block_tables, max_query_len, selected_blocks, num_segments, tile)
    _launch_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                      selected_blocks, out, launch)
    return out


def plan_attention(q, k_cache, block_tables, max_query_len, selected_blocks, num_segments, tile):
    """Pack G heads x BLOCK_Q tokens into >= 16 rows; split KV when the grid is small."""
    n_req, hkv, page = block_tables.shape[0], k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    sparse = selected_blocks is not None
    block_m = 16 if sparse else min(128, max(16, next_pow2(group * max(1, max_query_len))))
    block_m = max(block_m, next_pow2(group))
    block_q = 1 if sparse else block_m // group
    n_qblk = max(1, max_query_len) if sparse else math.ceil(max(1, max_query_len) / block_q)
    tile = tile or default_tile(page, block_m, n_req * n_qblk * hkv, sparse)
    if sparse:
        max_iters = topk_of(selected_blocks) * (page // tile)
    else:
        max_iters = math.ceil(block_tables.shape[1] * page / tile)
    if num_segments is None:
        programs = n_req * n_qblk * hkv
        steps = 1 if few_programs(block_m, programs) else MIN_TILES_PER_SEGMENT
        num_segments = min(MAX_SEGMENTS, max(1, target_programs(q) // programs), max(1, max_iters // steps))
    return AttnLaunch(block_m, block_q, n_qblk, tile, prev_pow2(num_segments))


def topk_of(selected_blocks: torch.Tensor | BlockScores) -> int:
    """The blocks a token attends to at most (MSA)."""
    return selected_blocks.topk if isinstance(selected_blocks, BlockScores) else selected_blocks.shape[-1]


def _selection(sel: torch.Tensor | BlockScores | None, block_tables: torch.Tensor) -> tuple:
    """(the kernel's sel_ptr tensor, its token and head strides, its constexprs) for block scores (SELECT: the
    kernel ranks them, selection_args), selected blocks, or none (dense: the block tables as a dummy)."""
    if isinstance(sel, BlockScores):
        s = sel.scores
        return s, (s.stride(0), s.stride(1)), {**selection_args(s.shape[-1], sel.topk), "SPARSE": True,
                                               "SELECT": True}
    unused = {**selection_args(1, 1), "SELECT": False}  # the selection's constexprs, not read
    if sel is None:
        return block_tables, (0, 0), {**unused, "TOPK": 1, "SPARSE": False}
    return sel, (sel.stride(0), sel.stride(1)), {**unused, "TOPK": sel.shape[-1], "SPARSE": True}


def default_tile(page: int, block_m: int, programs: int, sparse: bool) -> int:
    """Keys a program steps over at once (FEW_TILE for few programs, else TILE_BY_PROGRAMS), at most a page."""
    if block_m > WHOLE_PAGE_ROWS:
        return min(page, 64)
    if few_programs(block_m, programs):
        return min(page, FEW_TILE[sparse])
    keys = next((k for at_least, k in TILE_BY_PROGRAMS[sparse] if programs >= at_least), 32)
    return min(page, keys)


def few_programs(block_m: int, programs: int) -> bool:
    """So few programs before splitting that each segment takes one key step (FEW_PROGRAMS)."""
    return block_m <= WHOLE_PAGE_ROWS and programs <= FEW_PROGRAMS


def _launch_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl, scale, sel, out, launch):
    from m3bench.runtime.kernels.attention_triton import (
        paged_attn_kernel,
        reduce_kernel,
    )

    fmt = kv_format_of(k_cache)
    if kv_format_of(v_cache) is not fmt:
        raise ValueError("K and V caches must share one format")
    kd, ks, kgs = cache_kernel_args(k_cache)
    vd, vs, vgs = cache_kernel_args(v_cache)
    n_tok, hq, d = q.shape
    hkv, page = k_cache.shape[1], k_cache.shape[2]
    _check_layout(q, out, kd, vd, page, launch.tile, d)
    n_seg = launch.n_seg
    part_o = q.new_empty((n_tok, hq, n_seg, d), dtype=torch.float32) if n_seg > 1 else out
    part_lse = q.new_empty((n_tok, hq, n_seg), dtype=torch.float32) if n_seg > 1 else out
    sel_t, sel_strides, sel_args = _selection(sel, block_tables)
    grid = (block_tables.shape[0] * launch.n_qblk, hkv, n_seg)
    paged_attn_kernel[grid](
        q, out, part_o, part_lse, kd, ks, kgs, vd, vs, vgs,
        block_tables, seq_lens, qsl, sel_t, scale * math.log2(math.e), launch.n_qblk, n_seg,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *kd.stride()[:3], *scale_row_strides(k_cache), *vd.stride()[:3], *scale_row_strides(v_cache),
        block_tables.stride(0), *sel_strides,
        HQ=hq, G=hq // hkv, D=d, PAGE=page, TILE=launch.tile, BLOCK_M=launch.block_m,
        BLOCK_Q=launch.block_q, SPLIT=n_seg > 1, **sel_args,
        FMT=FMT_CODE[fmt], F32=q.dtype == torch.float32 or interpreting(), ASM=fmt is KVFormat.NVFP4 and nvfp4_asm(q),
        num_warps=4,
        num_stages=3,
        **pdl_args(q),
    )
    if n_seg > 1:
        reduce_kernel[(n_tok, hq)](
            part_o, part_lse, out, qsl, block_tables.shape[0], out.stride(0), out.stride(1),
            HQ=hq, D=d, N_SEG=n_seg, num_warps=4, **pdl_args(q),
        )


def _check_layout(q, out, kd, vd, page, tile, d):
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if page % tile or tile < 16:
        raise ValueError(f"tile {tile} must be >= 16 and divide the page size {page}")
    for name, t in (("q", q), ("out", out), ("k_cache", kd), ("v_cache", vd)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
