"""Torch attention backend: per sequence, gather K/V (and index keys) through the block table and
attend with explicit masks. Correct at any page size; slow; the reference for the GPU kernels.

GQA: q head h reads KV head h // (Hq / Hkv). Query tokens are processed in chunks so the score
tensor stays under ~16M elements.
"""

from __future__ import annotations

import torch

from m3bench.runtime.attention import msa
from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.config import MsaConfig
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.layers.norm import compute_dtype

SCORE_ELEMENTS = 1 << 24


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """q [q, Hq, d], k/v [Hkv, S, d], allowed [q, Hkv or 1, S] bool -> [q, Hq, d] (softmax in fp32)."""
    nq, hq, d = q.shape
    hkv = k.shape[0]
    ct = compute_dtype(q.dtype)
    qh = q.to(ct).view(nq, hkv, hq // hkv, d).permute(1, 2, 0, 3)  # [Hkv, G, q, d]
    s = torch.matmul(qh, k.to(ct)[:, None].transpose(-1, -2)) * scale  # [Hkv, G, q, S]
    s = s.masked_fill(~allowed.permute(1, 0, 2)[:, None], float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), v.to(ct)[:, None])  # [Hkv, G, q, d]
    return o.permute(2, 0, 1, 3).reshape(nq, hq, d).to(q.dtype)


def causal_mask(positions: torch.Tensor, length: int) -> torch.Tensor:
    """[q, 1, length]: key j is visible to the query at position p iff j <= p."""
    keys = torch.arange(length, device=positions.device)
    return (keys[None, :] <= positions[:, None])[:, None, :]


def query_chunks(n: int, heads: int, length: int) -> list[tuple[int, int]]:
    step = max(1, SCORE_ELEMENTS // max(1, heads * length))
    return [(a, min(n, a + step)) for a in range(0, n, step)]


class TorchBackend:
    """`dense(...)` and `msa(...)` take one layer's q [T, Hq, d] (and iq [T, Hi, di]) for every
    sequence of the step; K/V/ik must already be written to the cache."""

    graph_safe = False  # reads the host mirrors (seq_lens_host, query_lens_host)

    def dense(self, layer: int, q: torch.Tensor, meta: AttnMetadata, kv: KVCache, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        for b, (a, z) in enumerate(_spans(meta)):
            k, v, _ = kv.gather(layer, meta.block_tables[b], meta.seq_lens_host[b])
            pos = meta.positions[a:z]
            for c0, c1 in query_chunks(z - a, q.shape[1], k.shape[1]):
                allowed = causal_mask(pos[c0:c1], k.shape[1])
                out[a + c0:a + c1] = attend(q[a + c0:a + c1], k, v, allowed, scale)
        return out

    def msa(self, layer: int, q: torch.Tensor, iq: torch.Tensor, meta: AttnMetadata, kv: KVCache,
            scale: float, m: MsaConfig) -> torch.Tensor:
        out = torch.empty_like(q)
        for b, (a, z) in enumerate(_spans(meta)):
            k, v, ik = kv.gather(layer, meta.block_tables[b], meta.seq_lens_host[b])
            pos = meta.positions[a:z]
            for c0, c1 in query_chunks(z - a, q.shape[1], k.shape[1]):
                p = pos[c0:c1]
                selected = msa.select_blocks(msa.block_scores(iq[a + c0:a + c1], ik, p, m.block_size), p, m)
                allowed = msa.selection_mask(selected, p, k.shape[1], m.block_size)
                out[a + c0:a + c1] = attend(q[a + c0:a + c1], k, v, allowed, scale)
        return out


def _spans(meta: AttnMetadata) -> list[tuple[int, int]]:
    spans, start = [], 0
    for n in meta.query_lens_host:
        spans.append((start, start + n))
        start += n
    return spans
