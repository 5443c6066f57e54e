"""Triton attention backend: paged GQA attention and the MSA indexer on the raw KV pages, with the
KV format (bf16 / fp8 / nvfp4) decoded inside the kernels. Graph safe: launch sizes come from
static bounds (the block-table width and the host list of query lengths, which the decode graphs
fix at 1) and every length is read on the device.

    model = M3ForCausalLM(cfg, dtype=torch.bfloat16, device="cuda", backend=TritonBackend())

Decode, verify chunks and prefill chunks all run through the same kernels (per-token causal
limits). MSA layers need one sparse block per page (tokens_per_block == msa.block_size) and one
forced local block. Runs on CUDA, or on CPU under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.config import MsaConfig
from m3bench.runtime.errors import ConfigError
from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.backend import KernelBackend, use_triton
from m3bench.runtime.kernels.msa_index import (
    BlockScores,
    msa_block_scores,
    msa_select_blocks,
)
from m3bench.runtime.kv_cache import KVCache

# MSA layers select their blocks in the attention launch (msa_index.BlockScores: every attention program ranks its
# token's block scores) instead of a top-k launch between the scores and the attention. On: a 37-layer H100 rank step
# (2026-12-07, docs/performance.md 2t) B1 realistic 2.853 -> 2.826 ms alone, 2.777 with the routing in the experts'
# launch; B4 within 0.3%; 128k B1 3.670 -> 3.623 ms with both.
SELECT_IN_ATTENTION = True


def check_msa_layout(m: MsaConfig, tokens_per_block: int) -> None:
    """The kernels select whole pages: a page must be one sparse block, one local block forced."""
    if tokens_per_block != m.block_size:
        raise ConfigError(f"the Triton MSA kernels need tokens_per_block == the MSA block size "
                          f"({m.block_size}), got {tokens_per_block}; use tokens_per_block={m.block_size} "
                          f"or attention_backend='torch'")
    if m.local_blocks != 1:
        raise ConfigError(f"the Triton MSA kernels force exactly one local block, the model asks for "
                          f"{m.local_blocks}; use attention_backend='torch'")


def max_query_len(meta: AttnMetadata) -> int:
    """Static launch bound from the host mirror (no device read; 1 in the decode graphs)."""
    return max(meta.query_lens_host, default=1)


class TritonBackend:
    """`dense(...)` / `msa(...)` as in AttentionBackend; K/V/ik must already be in the cache."""

    graph_safe = True

    def __init__(self, kernel_backend: KernelBackend = KernelBackend.TRITON, fuse_ops: bool = True,
                 select_in_attention: bool | None = None):
        self.kernel_backend = kernel_backend
        self.fuse_ops = fuse_ops  # the layers' fused norm + RoPE + KV write and add + norm (attention.kernel_backend_of)
        # msa(): the top-k in the attention launch (None: SELECT_IN_ATTENTION)
        self.select_in_attention = SELECT_IN_ATTENTION if select_in_attention is None else select_in_attention

    def dense(self, layer: int, q: torch.Tensor, meta: AttnMetadata, kv: KVCache, scale: float) -> torch.Tensor:
        k, v, _ = kv.pages(layer)
        return paged_attention(q, k, v, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
                               max_query_len=max_query_len(meta), backend=self.kernel_backend)

    def msa(self, layer: int, q: torch.Tensor, iq: torch.Tensor, meta: AttnMetadata, kv: KVCache,
            scale: float, m: MsaConfig) -> torch.Tensor:
        if self.select_in_attention and use_triton(self.kernel_backend, q):
            return self.msa_attend(layer, q, self.msa_scores(layer, iq, meta, kv, m), meta, kv, scale)
        return self.msa_attend(layer, q, self.msa_select(layer, iq, meta, kv, m), meta, kv, scale)

    def msa_scores(self, layer: int, iq: torch.Tensor, meta: AttnMetadata, kv: KVCache, m: MsaConfig) -> BlockScores:
        """The MSA layer's block scores, for msa_attend to select from in the attention launch (no top-k launch)."""
        check_msa_layout(m, kv.page_size)
        k, _, ik = kv.pages(layer)
        scores = msa_block_scores(iq, ik, meta.block_tables, meta.seq_lens, meta.query_start_loc, m.init_blocks,
                                  max_query_len=max_query_len(meta))
        return _per_kv_head(BlockScores(scores, m.topk_blocks, kv.page_size), k.shape[1])

    def msa_select(self, layer: int, iq: torch.Tensor, meta: AttnMetadata, kv: KVCache, m: MsaConfig) -> torch.Tensor:
        """The MSA layer's selected blocks [T, Hkv, topk] from its index queries and index-key cache (msa's first
        half: a caller may run it beside the query projection, layers.attention's index_beside)."""
        check_msa_layout(m, kv.page_size)
        k, _, ik = kv.pages(layer)
        return self.select(iq, ik, meta, m, hkv=k.shape[1])

    def msa_attend(self, layer: int, q: torch.Tensor, sel: torch.Tensor | BlockScores, meta: AttnMetadata,
                   kv: KVCache, scale: float) -> torch.Tensor:
        """Paged attention over the selected blocks, or the top-k blocks of block scores (msa's second half)."""
        k, v, _ = kv.pages(layer)
        return paged_attention(q, k, v, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
                               selected_blocks=sel, max_query_len=max_query_len(meta),
                               backend=self.kernel_backend)

    def select(self, iq: torch.Tensor, ik, meta: AttnMetadata, m: MsaConfig, hkv: int) -> torch.Tensor:
        """Selected blocks [T, Hkv, topk] int32 (index head h serves KV head h; one head broadcasts)."""
        sel = msa_select_blocks(iq, ik, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                m.topk_blocks, m.init_blocks, max_query_len=max_query_len(meta),
                                backend=self.kernel_backend)
        return _per_kv_head(sel, hkv)


def _per_kv_head(sel, hkv: int):
    """A selection (or BlockScores) of Hi index heads for hkv KV heads: as it is, or one head broadcast."""
    heads = (sel.scores if isinstance(sel, BlockScores) else sel).shape[1]
    if heads == hkv:
        return sel
    if heads == 1:
        return sel.expand(hkv) if isinstance(sel, BlockScores) else sel.expand(-1, hkv, -1)
    raise ConfigError(f"{heads} local index heads cannot serve {hkv} local KV heads")
