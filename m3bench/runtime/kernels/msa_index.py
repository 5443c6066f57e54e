"""MSA block selection entry point: Triton on CUDA, the torch reference on CPU.

    sel = msa_select_blocks(iq, ik_cache, block_tables, seq_lens, query_start_loc, topk=16)

iq [T, Hi, di] (index head h serves KV head h); ik_cache [pages, P, di] (bf16/fp32, fp8 or
Nvfp4Pages), P == sparse block size. Returns [T, Hi, topk] int32 block ids: the token's local
block first, then init blocks, then the highest max-scores, -1 padded. Feed it to
paged_attention(..., selected_blocks=sel).
"""

from __future__ import annotations

import math

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
    target_programs,
    use_triton,
)
from m3bench.runtime.kernels.kv_quant import KVFormat, PagedTensor, kv_format_of

MAX_SEGMENTS = 64
WAVES_PER_TARGET = 4  # segments for ~4x target_programs: each program streams its keys alone (latency-bound
#                       loads, one valid query row at decode), and more of them per SM hide that; the
#                       scores are written per block either way, so more segments cost no extra traffic
MAX_TOPK_CHUNK = 4096  # score rows up to this many blocks stay in registers


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
) -> torch.Tensor:
    """Top-k key blocks per query token and index head (block score = max of iq . ik)."""
    if not use_triton(backend, iq):
        return reference.msa_select_blocks_ref(
            iq, ik_cache, block_tables, seq_lens, query_start_loc, topk, init_blocks, out
        )
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    n_tok, hi, _ = iq.shape
    if out is None:
        out = torch.empty((n_tok, hi, topk), dtype=torch.int32, device=iq.device)
    scores = torch.empty((n_tok, hi, block_tables.shape[1]), dtype=torch.float32, device=iq.device)
    _launch_scores(iq, ik_cache, block_tables, seq_lens, query_start_loc, init_blocks,
                   scores, max(1, max_query_len), num_segments)
    _launch_topk(scores, out, ik_cache.shape[1], seq_lens, query_start_loc, topk, max(1, max_query_len))
    return out


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
        iq.stride(0), iq.stride(1), data.stride(0), data.stride(1), sc.stride(0), sc.stride(1),
        block_tables.stride(0), scores.stride(0), scores.stride(1),
        HI=hi, D=d, PAGE=page, TILE=tile, BLOCK_M=block_m, BLOCK_Q=block_q,
        INIT_BLOCKS=init_blocks, FMT=FMT_CODE[kv_format_of(ik_cache)],
        F32=iq.dtype == torch.float32 or interpreting(), ASM=kv_format_of(ik_cache) is KVFormat.NVFP4 and nvfp4_asm(iq),
        num_warps=4, num_stages=2, **pdl_args(iq),
    )


def _launch_topk(scores, out, page, seq_lens, qsl, topk, max_q):
    from m3bench.runtime.kernels.msa_index_triton import topk_kernel

    n_req, hi = seq_lens.shape[0], scores.shape[1]
    chunk = min(MAX_TOPK_CHUNK, max(16, next_pow2(scores.shape[-1])))
    topk_kernel[(n_req * max_q, hi)](
        scores, out, seq_lens, qsl, max_q,
        scores.stride(0), scores.stride(1), out.stride(0), out.stride(1),
        PAGE=page, TOPK=topk, TOPK_P2=next_pow2(topk), CHUNK=chunk,
        ONE_CHUNK=chunk >= scores.shape[-1], num_warps=4 if chunk <= 1024 else 8, **pdl_args(scores),
    )
