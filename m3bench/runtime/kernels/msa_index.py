"""MSA block selection entry point: Triton on CUDA, the torch reference on CPU.

    sel = msa_select_blocks(iq, ik_cache, block_tables, seq_lens, query_start_loc, topk=16)

iq [T, Hi, di] (index head h serves KV head h); ik_cache [pages, P, di] (bf16/fp32, fp8 or
Nvfp4Pages), P == sparse block size. Returns [T, Hi, topk] int32 block ids: the token's local
block first, then init blocks, then the highest max-scores, -1 padded. Feed it to
paged_attention(..., selected_blocks=sel).

    scores = msa_block_scores(iq, ik_cache, block_tables, seq_lens, query_start_loc)
    out = paged_attention(..., selected_blocks=BlockScores(scores, 16, page))   # the same selection, in-kernel

The second form leaves out the top-k launch: the attention kernel ranks the row's scores itself (every program of
the row alike, row_top_ids) and attends to the blocks the top-k kernel would have written, in the same slot order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    scale_row_strides,
    target_programs,
    use_triton,
)
from m3bench.runtime.kernels.kv_quant import KVFormat, PagedTensor, kv_format_of

MAX_SEGMENTS = 64
WAVES_PER_TARGET = 4  # segments for ~4x target_programs: each program streams its keys alone (latency-bound
#                       loads, one valid query row at decode), and more of them per SM hide that; the
#                       scores are written per block either way, so more segments cost no extra traffic
MAX_TOPK_CHUNK = 4096  # score rows up to this many blocks stay in registers
SCORE_STAGES = 2  # pipeline stages of the scores kernel (3-4 were within 1% on the H200, performance.md 2d)
NVFP4_DECODE_MAX_REGS = None  # a register cap for the NVFP4 scores kernel at decode rows (None: unbounded). H200,
#                               B32 (benchmarks/msa_index_variants.py, 2026-12-03): unbounded 42.1 / 131.5 us at
#                               32k / 128k, capped at 96 (5 programs an SM) 45.9 / 138.6, at 88 45.2 / 142.2
RANK_BLOCKS = 128  # rows of at most this many valid blocks are selected by rank (an [n, n] compare tile)


def msa_select_blocks(
    iq: torch.Tensor,
    ik_cache: PagedTensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    topk: int,
    init_blocks: int = 0,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    backend: KernelBackend = KernelBackend.AUTO,
    num_segments: int | None = None,
    topk_warps: int | None = None,
) -> torch.Tensor:
    """Top-k key blocks per query token and index head (block score = max of iq . ik); topk_warps: the
    selection kernel's warps (default: topk_warps_for(its rows))."""
    if not use_triton(backend, iq):
        return reference.msa_select_blocks_ref(
            iq, ik_cache, block_tables, seq_lens, query_start_loc, topk, init_blocks, out
        )
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if out is None:
        out = torch.empty((*iq.shape[:2], topk), dtype=torch.int32, device=iq.device)
    scores = msa_block_scores(iq, ik_cache, block_tables, seq_lens, query_start_loc, init_blocks, max_query_len,
                              num_segments)
    select_top_blocks(scores, out, ik_cache.shape[1], seq_lens, query_start_loc, topk, max(1, max_query_len),
                      topk_warps)
    return out


@dataclass(frozen=True)
class BlockScores:
    """Block scores [T, Hi, width] (msa_block_scores) whose top-k blocks a kernel selects where it reads them:
    paged_attention(..., selected_blocks=BlockScores(...)) attends to the blocks select_top_blocks would pick,
    in its slot order, with no launch of its own."""

    scores: torch.Tensor
    topk: int
    page: int

    def expand(self, heads: int) -> BlockScores:
        """One index head's scores serving `heads` KV heads (a stride-0 view)."""
        return replace(self, scores=self.scores.expand(-1, heads, -1))

    def selected(self, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int) -> torch.Tensor:
        """The blocks [T, Hi, topk] int32 select_top_blocks picks from these scores (Triton)."""
        out = torch.empty((*self.scores.shape[:2], self.topk), dtype=torch.int32, device=self.scores.device)
        select_top_blocks(self.scores, out, self.page, seq_lens, query_start_loc, self.topk, max(1, max_query_len))
        return out


def msa_block_scores(iq: torch.Tensor, ik_cache: PagedTensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     query_start_loc: torch.Tensor, init_blocks: int = 0, max_query_len: int | None = None,
                     num_segments: int | None = None) -> torch.Tensor:
    """The first half of msa_select_blocks (Triton): block scores [T, Hi, width] fp32, width the block table's; the
    local block +inf, init blocks INIT_SCORE, blocks past the local one unspecified."""
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    scores = torch.empty((*iq.shape[:2], block_tables.shape[1]), dtype=torch.float32, device=iq.device)
    _launch_scores(iq, ik_cache, block_tables, seq_lens, query_start_loc, init_blocks,
                   scores, max(1, max_query_len), num_segments)
    return scores


def _launch_scores(iq, ik_cache, block_tables, seq_lens, qsl, init_blocks, scores, max_q, n_seg):
    from m3bench.runtime.kernels.msa_index_triton import block_scores_kernel

    n_req, (_, hi, d), page = block_tables.shape[0], iq.shape, ik_cache.shape[1]
    data, sc, gs = cache_kernel_args(ik_cache)
    block_m = min(128, max(16, next_pow2(hi * max_q), next_pow2(hi)))
    block_q = block_m // hi
    n_qblk = math.ceil(max_q / block_q)
    if n_seg is None:
        n_seg = min(MAX_SEGMENTS, block_tables.shape[1],
                    max(1, WAVES_PER_TARGET * target_programs(iq) // (n_req * n_qblk)))
    tile = min(page, 128 if block_m <= WHOLE_PAGE_ROWS else 64)  # whole pages: 1.4x faster than 64 keys at
    #                                                            decode on the H200 (B32, 32k-128k, FP8 / NVFP4 keys)
    block_scores_kernel[(n_req * n_qblk, n_seg)](
        iq, data, sc, gs, scores, block_tables, seq_lens, qsl, n_qblk, n_seg,
        iq.stride(0), iq.stride(1), data.stride(0), data.stride(1), *scale_row_strides(ik_cache),
        block_tables.stride(0), scores.stride(0), scores.stride(1),
        HI=hi, D=d, PAGE=page, TILE=tile, BLOCK_M=block_m, BLOCK_Q=block_q,
        INIT_BLOCKS=init_blocks, FMT=FMT_CODE[kv_format_of(ik_cache)],
        F32=iq.dtype == torch.float32 or interpreting(), ASM=kv_format_of(ik_cache) is KVFormat.NVFP4 and nvfp4_asm(iq),
        num_warps=4, num_stages=SCORE_STAGES, **_register_cap(kv_format_of(ik_cache), block_m), **pdl_args(iq),
    )


def _register_cap(fmt: KVFormat, block_m: int) -> dict:
    """The launch option capping the scores kernel's registers a thread (NVFP4_DECODE_MAX_REGS), if any."""
    if fmt is KVFormat.NVFP4 and block_m <= WHOLE_PAGE_ROWS and NVFP4_DECODE_MAX_REGS is not None:
        return {"maxnreg": NVFP4_DECODE_MAX_REGS}
    return {}


def select_top_blocks(scores: torch.Tensor, out: torch.Tensor, page: int, seq_lens: torch.Tensor, qsl: torch.Tensor,
                      topk: int, max_q: int, num_warps: int | None = None) -> None:
    """The top-k half of msa_select_blocks (Triton) on block scores [T, Hi, width] already made (width >= every
    row's valid blocks) into out [T, Hi, topk]; num_warps: topk_warps_for(width, ...) unless given."""
    from m3bench.runtime.kernels.msa_index_triton import topk_kernel

    n_req, hi, width = seq_lens.shape[0], scores.shape[1], scores.shape[-1]
    sel = selection_args(width, topk)
    topk_kernel[(n_req * max_q, hi)](
        scores, out, seq_lens, qsl, max_q,
        scores.stride(0), scores.stride(1), out.stride(0), out.stride(1),
        PAGE=page, **sel, num_warps=num_warps or topk_warps_for(width, sel["RANK_N"]), **pdl_args(scores),
    )


def selection_args(width: int, topk: int) -> dict:
    """The selection's constexprs for rows of `width` block scores (topk_kernel, msa_index_triton.row_top_ids):
    rank tile, rounds from RANK_N valid blocks (LONG), the row in registers up to CHUNK blocks."""
    rank_n = max(next_pow2(topk), min(RANK_BLOCKS, next_pow2(width)))
    chunk = min(MAX_TOPK_CHUNK, max(16, next_pow2(width)))
    return {"TOPK": topk, "TOPK_P2": next_pow2(topk), "RANK_N": rank_n, "LONG": width > rank_n, "CHUNK": chunk,
            "ONE_CHUNK": chunk >= width}


def topk_warps_for(width: int, rank_n: int) -> int:
    """Rows that always fit the rank tile: a warp per 32 of its columns, so that each thread holds one
    block's column and the rank's sum stays in the thread; longer rows: the rounds' tile, 4 or 8 warps."""
    if width > rank_n:
        return 4 if width <= 1024 else 8
    return max(1, rank_n // 32)
