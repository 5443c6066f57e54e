"""Attention layer: fused q|k|v(|index_q|index_k) projection, per-head q/k norm, partial RoPE, the
MSA index branch on sparse layers, KV-cache write through the slot mapping, then the backend.

At TP, q/k/v heads and index heads split over the world (index head h serves KV head h); with
fewer KV heads than ranks each KV head (and its index head) is duplicated on world / Hkv ranks, as
TensorRT-LLM runs M3 at TP8; the single index key head is replicated; o_proj is row-parallel with
one all-reduce. On the Triton backend each branch's per-head norms, RoPE and KV write run as one
kernel (kernels.norm_rope); with `fuse_qkv_heads` (off by default) the projection at up to 4 rows ends in them,
one launch for both (kernels.skinny_heads); with `index_beside` (off by default) an MSA layer at up to 4 rows runs
its index branch (projection, norm / RoPE / write, block selection) on a side lane beside q|k|v (kernels.lanes);
the torch path is the reference. `replicate_index_projection()` makes a
rank compute every index head (as a deployment with a replicated index projection does) and keep
the heads serving its KV heads.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import torch
from torch import nn

from m3bench.runtime.attention import kernel_backend_of
from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.config import AttnKind, ModelConfig, NormKind
from m3bench.runtime.kernels.backend import use_triton
from m3bench.runtime.kernels.lanes import SideLane
from m3bench.runtime.kernels.norm_rope import (
    Branch,
    BranchWrite,
    norm_rope_supported,
    norm_rope_write,
    norm_rope_write_pair,
)
from m3bench.runtime.kernels.skinny_heads import skinny_heads, skinny_heads_supported
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.layers.linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    Segment,
    WeightSlot,
    linear,
    skinny_runs,
)
from m3bench.runtime.layers.norm import RMSNorm
from m3bench.runtime.layers.rotary import apply_rope
from m3bench.runtime.parallel import SINGLE, TPGroup

INDEX_BESIDE_ROWS = 4  # as the shared expert beside (layers.moe): from 5 rows the GEMMs alone fill the GPU


def _segments(cfg: ModelConfig, sparse: bool) -> tuple[Segment, ...]:
    hkv = cfg.num_kv_heads  # fewer KV heads than ranks: each is duplicated (rank r holds r // (world / hkv))
    segs = [Segment("q_proj", cfg.q_size), Segment("k_proj", cfg.kv_size, heads=hkv),
            Segment("v_proj", cfg.kv_size, heads=hkv)]
    if sparse:
        m = cfg.msa
        segs += [Segment("index_q_proj", m.index_heads * m.index_dim, heads=m.index_heads),
                 Segment("index_k_proj", m.index_dim, sharded=False)]
    return tuple(segs)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device, tp: TPGroup = SINGLE):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        self.sparse = cfg.attn_kinds[layer] is AttnKind.MSA
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.qkv = ColumnParallelLinear(cfg.hidden_size, _segments(cfg, self.sparse), cfg.qkv_bias, dtype, device, tp)
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, "o_proj", False, dtype, device, tp)
        norm = lambda dim: RMSNorm(dim, cfg.rms_norm_eps, cfg.norm, dtype, device)  # noqa: E731
        self.q_norm = norm(cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = norm(cfg.head_dim) if cfg.qk_norm else None
        self.index_q_norm = norm(cfg.msa.index_dim) if self.sparse else None
        self.index_k_norm = norm(cfg.msa.index_dim) if self.sparse else None
        self.index_pick: slice | None = None  # replicated index projection: this rank's heads
        self.fuse_branches = True  # fused path, MSA layers: both branches' norm + RoPE + write in one launch
        self.fuse_qkv_heads = False  # fused path at skinny rows: the projection ends in those (kernels.skinny_heads)
        self.index_beside = False  # fused path, MSA layers, up to INDEX_BESIDE_ROWS rows: index branch on a side lane

    def replicate_index_projection(self) -> None:
        """Every index head computed on this rank, the ones of its KV heads kept (call before loading)."""
        tp = self.qkv.tp
        if not self.sparse or tp.world == 1:
            return
        segs = tuple(replace(s, sharded=False) if s.name == "index_q_proj" else s for s in self.qkv.segments)
        w = self.qkv.weight
        self.qkv = ColumnParallelLinear(w.shape[1], segs, self.qkv.bias is not None, w.dtype, w.device, tp)
        piece, pieces = tp.head_split(self.cfg.msa.index_heads, "index heads")
        n = self.cfg.msa.index_heads // pieces
        self.index_pick = slice(piece * n, (piece + 1) * n)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMetadata, kv: KVCache,
                backend) -> torch.Tensor:
        """x [T, H] (already input-normed) -> [T, H]."""
        fused = use_triton(kernel_backend_of(backend), x) and self._fusable(x, cos)
        if fused and self._beside_runs(x, backend):
            o = self._msa_beside(x, cos, sin, meta, kv, backend)
        else:
            o = self._attend(x, fused, cos, sin, meta, kv, backend)
        return self.o_proj(o.reshape(x.shape[0], -1))

    def _attend(self, x, fused: bool, cos, sin, meta: AttnMetadata, kv: KVCache, backend) -> torch.Tensor:
        """The projection, both branches' norm / RoPE / writes, then dense or MSA attention, one after another."""
        writes = self._branch_writes(kv) if fused else None  # built once, for either fused path
        if writes is not None and self.fuse_qkv_heads and self._heads_run(x, self.qkv.weight, writes):
            q, iq = self._project_heads(x, writes, cos, sin, meta)
        else:
            y = self.qkv(x)
            q, iq = self._prepare_fused(y, cos, sin, meta, writes) if fused else self._prepare_torch(y, cos, sin,
                                                                                                      meta, kv)
        if not self.sparse:
            return backend.dense(self.layer, q, meta, kv, self.scale)
        if self.index_pick is not None:
            iq = iq[:, self.index_pick]
        return backend.msa(self.layer, q, iq, meta, kv, self.scale, self.cfg.msa)

    def _prepare_torch(self, y, cos, sin, meta: AttnMetadata, kv: KVCache):
        """q [T, Hq, d] and iq [T, Hi, di] (None on dense layers) normed and rotated; K/V/ik written."""
        parts = self.qkv.split(y)
        t, d = y.shape[0], self.head_dim
        q = self._norm_rope(parts[0].view(t, -1, d), self.q_norm, cos, sin)
        k = self._norm_rope(parts[1].view(t, -1, d), self.k_norm, cos, sin)
        v = parts[2].view(t, -1, d)
        if not self.sparse:
            kv.write(self.layer, k, v, None, meta.slot_mapping)
            return q, None
        iq = self._norm_rope(parts[3].view(t, -1, self.cfg.msa.index_dim), self.index_q_norm, cos, sin)
        ik = self._norm_rope(parts[4], self.index_k_norm, cos, sin)
        kv.write(self.layer, k, v, ik, meta.slot_mapping)
        return q, iq

    def _fusable(self, y: torch.Tensor, cos: torch.Tensor) -> bool:
        half = cos.shape[-1]
        return norm_rope_supported(y, self.head_dim, half) and (
            not self.sparse or norm_rope_supported(y, self.cfg.msa.index_dim, half))

    def _branch_writes(self, kv: KVCache) -> tuple[BranchWrite, ...]:
        """Where the heads of each branch sit in the projection's output, their norms and caches (main, index)."""
        sizes, d = self.qkv.local_sizes, self.head_dim
        at = list(accumulate((0, *sizes)))
        k, v, ik = kv.pages(self.layer)
        weight = lambda norm: None if norm is None else norm.weight  # noqa: E731
        main = BranchWrite(Branch(at[0], at[1], at[2], sizes[0] // d, sizes[1] // d, sizes[2] // d, d),
                           weight(self.q_norm), weight(self.k_norm), k, v)
        if not self.sparse:
            return (main,)
        di = self.cfg.msa.index_dim
        return main, BranchWrite(Branch(at[3], at[4], 0, sizes[3] // di, 1, 0, di), self.index_q_norm.weight,
                                 self.index_k_norm.weight, ik)

    def _prepare_fused(self, y, cos, sin, meta: AttnMetadata, writes: tuple[BranchWrite, ...]):
        """As _prepare_torch over the branches' writes (_branch_writes), one Triton launch per branch, or one for
        both (fuse_branches: kernels.norm_rope)."""
        gemma, eps = self.cfg.norm is NormKind.GEMMA, self.cfg.rms_norm_eps
        write = lambda w: norm_rope_write(y, w.branch, w.q_weight, w.k_weight, eps, gemma, cos, sin,  # noqa: E731
                                          meta.slot_mapping, w.k_cache, w.v_cache)
        if not self.sparse:
            return write(writes[0]), None
        if self.fuse_branches:
            return norm_rope_write_pair(y, *writes, eps, gemma, cos, sin, meta.slot_mapping)
        return write(writes[0]), write(writes[1])

    def _heads_run(self, x: torch.Tensor, w: torch.Tensor, writes: tuple[BranchWrite, ...]) -> bool:
        """x @ w (the fused weight or some of its rows) ends in the writes' heads (kernels.skinny_heads): few rows
        on CUDA, plain weights, one head width, one cache format for the branches."""
        return (self.qkv.weight_scale is None and skinny_runs(x, w, self.qkv.skinny_rows)
                and skinny_heads_supported(x, w, writes, self.qkv.skinny_rows))

    def _project_heads(self, x, writes: tuple[BranchWrite, ...], cos, sin, meta: AttnMetadata):
        """q and iq (None on dense layers) from one launch: the projection, then its heads normed, rotated, written."""
        gemma, eps = self.cfg.norm is NormKind.GEMMA, self.cfg.rms_norm_eps
        _, outs = skinny_heads(x.contiguous(), self.qkv.weight, self.qkv.bias, writes, eps, gemma, cos, sin,
                               meta.slot_mapping)
        return outs[0], (outs[1] if self.sparse else None)

    def _beside_runs(self, x: torch.Tensor, backend) -> bool:
        """The index branch runs beside the query branch this call (index_beside, an MSA layer, few rows, plain
        weights, a backend that selects and attends apart)."""
        return (self.index_beside and self.sparse and 0 < x.shape[0] <= INDEX_BESIDE_ROWS
                and self.qkv.weight_scale is None and hasattr(backend, "msa_select"))

    def _msa_beside(self, x, cos, sin, meta: AttnMetadata, kv: KVCache, backend) -> torch.Tensor:
        """MSA attention with the index branch (its projection, norm / RoPE / index-key write, block scores and
        top-k) on a side lane while the main lane projects q|k|v, norms, rotates and writes K / V (kernels/lanes.py:
        concurrent on CUDA, inline in order elsewhere)."""
        main, index = self._branch_writes(kv)
        cut = index.branch.q_col  # the index rows of the fused weight start here
        index = replace(index, branch=replace(index.branch, q_col=0, k_col=index.branch.k_col - cut))
        with SideLane(x) as side:
            iq = self._branch_queries(x, slice(cut, None), index, cos, sin, meta)
            if self.index_pick is not None:
                iq = iq[:, self.index_pick]
            sel = backend.msa_select(self.layer, iq, meta, kv, self.cfg.msa)
        q = self._branch_queries(x, slice(0, cut), main, cos, sin, meta)
        side.join(sel)
        return backend.msa_attend(self.layer, q, sel, meta, kv, self.scale)

    def _branch_queries(self, x, rows: slice, write: BranchWrite, cos, sin, meta: AttnMetadata) -> torch.Tensor:
        """One branch from its rows of the fused weight: its projection, then its heads normed and rotated (queries
        returned, keys and values written); one launch where kernels.skinny_heads runs it (fuse_qkv_heads)."""
        w = self.qkv.weight[rows]
        bias = None if self.qkv.bias is None else self.qkv.bias[rows]
        gemma, eps = self.cfg.norm is NormKind.GEMMA, self.cfg.rms_norm_eps
        if self.fuse_qkv_heads and self._heads_run(x, w, (write,)):
            return skinny_heads(x.contiguous(), w, bias, (write,), eps, gemma, cos, sin, meta.slot_mapping)[1][0]
        y = linear(x, w, None, bias, self.qkv.skinny_rows)
        return norm_rope_write(y, write.branch, write.q_weight, write.k_weight, eps, gemma, cos, sin,
                               meta.slot_mapping, write.k_cache, write.v_cache)

    @staticmethod
    def _norm_rope(x: torch.Tensor, norm: RMSNorm | None, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x if norm is None else norm(x), cos, sin)

    def slots(self, prefix: str) -> list[WeightSlot]:
        out = self.qkv.slots(prefix) + self.o_proj.slots(prefix)
        for name in ("q_norm", "k_norm", "index_q_norm", "index_k_norm"):
            mod = getattr(self, name)
            if mod is not None:
                out.append(WeightSlot(f"{prefix}{name}.weight", mod.weight, None))
        return out
