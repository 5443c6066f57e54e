"""Fused per-head RMSNorm + partial RoPE + KV-cache write (Triton): one launch per attention branch
(norm_rope_write) or for both branches of an MSA layer (norm_rope_write_pair) instead of the ~15
torch ops of norm, rotate, quantize and indexed store each. The torch reference is
the attention layer's own path (layers.norm.rms_norm, layers.rotary.apply_rope, KVCache.write).

    q = norm_rope_write(y, Branch(q_col=0, k_col=Hq*d, v_col=(Hq+Hkv)*d, hq=Hq, hk=Hkv, hv=Hkv, d=d),
                        q_w, k_w, eps, gemma, cos, sin, slot_mapping, k_cache, v_cache)

y [T, N] the fused projection output (the branch's heads at its column offsets); cos / sin
[T, r/2] fp32; k_cache / v_cache [pages, H, P, d] or [pages, P, d] (index keys), any KV format.
Returns the normed, rotated query heads [T, hq, d] in y's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.backend import FMT_CODE, cache_kernel_args, pdl_args

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Branch:
    """Where one branch's heads sit in y: hq query heads from q_col, hk key heads from k_col, hv
    value heads from v_col (0: none, the index branch), each d wide."""

    q_col: int
    k_col: int
    v_col: int
    hq: int
    hk: int
    hv: int
    d: int


def norm_rope_supported(y: torch.Tensor, d: int, half: int) -> bool:
    return y.dtype in DTYPES and y.dim() == 2 and d >= 16 and d & (d - 1) == 0 and 2 * half <= d


def _cache_strides(cache: kq.PagedTensor, data: torch.Tensor, scales: torch.Tensor) -> tuple[int, ...]:
    if len(cache.shape) == 4:  # [pages, H, P, d]
        return (*data.stride()[:3], *scales.stride()[:3])
    return (data.stride(0), 0, data.stride(1), scales.stride(0), 0, scales.stride(1))  # index keys [pages, P, d]


@dataclass(frozen=True)
class BranchWrite:
    """One branch of a norm_rope_write_pair launch: where its heads are, its norm weights (None: no
    norm), its caches (v_cache None: no value heads) and optionally its query output."""

    branch: Branch
    q_weight: torch.Tensor | None
    k_weight: torch.Tensor | None
    k_cache: kq.PagedTensor
    v_cache: kq.PagedTensor | None = None
    q_out: torch.Tensor | None = None


def norm_rope_write(y: torch.Tensor, b: Branch, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                    eps: float, gemma: bool, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                    k_cache: kq.PagedTensor, v_cache: kq.PagedTensor | None = None,
                    q_out: torch.Tensor | None = None) -> torch.Tensor:
    """One branch, one launch: its query heads [T, hq, d] out, its keys (and values) into the caches."""
    return _launch(y, (BranchWrite(b, q_weight, k_weight, k_cache, v_cache, q_out),), eps, gemma, cos, sin,
                   slot_mapping)[0]


def norm_rope_write_pair(y: torch.Tensor, main: BranchWrite, index: BranchWrite, eps: float, gemma: bool,
                         cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Both branches of an MSA layer (q/k/v and the index q/k) in one launch -> (q, iq); two launches
    when their caches differ in format."""
    if kq.kv_format_of(main.k_cache) is not kq.kv_format_of(index.k_cache):
        return (_launch(y, (main,), eps, gemma, cos, sin, slot_mapping)[0],
                _launch(y, (index,), eps, gemma, cos, sin, slot_mapping)[0])
    return _launch(y, (main, index), eps, gemma, cos, sin, slot_mapping)


def _launch(y, writes: tuple[BranchWrite, ...], eps, gemma, cos, sin, slot_mapping) -> tuple[torch.Tensor, ...]:
    from m3bench.runtime.kernels.norm_rope_triton import norm_rope_write_kernel

    heads = HeadRows.of(y, writes, cos, sin)
    if y.shape[0]:
        norm_rope_write_kernel[(y.shape[0], heads.count)](
            y, heads.cos, heads.sin, slot_mapping, float(eps), y.stride(0), heads.cos.stride(0), *heads.args,
            **heads.meta(gemma), num_warps=1 if heads.d_max <= 128 else 2, **pdl_args(y),
        )
    return heads.outs


@dataclass(frozen=True)
class HeadRows:
    """The head rows of one or two branches as norm_rope_triton.head_row takes them: the query outputs, the
    branches' arguments in its order, its constexprs (`meta`) and cos / sin made fp32 and contiguous."""

    writes: tuple[BranchWrite, ...]
    outs: tuple[torch.Tensor, ...]
    args: tuple
    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def of(cls, y: torch.Tensor, writes: tuple[BranchWrite, ...], cos: torch.Tensor, sin: torch.Tensor) -> "HeadRows":
        half = cos.shape[-1]
        for w in writes:
            if not norm_rope_supported(y, w.branch.d, half) or y.stride(-1) != 1:
                raise ValueError(f"norm_rope_write needs a [T, N] {DTYPES} row-contiguous input and a power-of-two "
                                 f"head dim >= 16 with rotary <= head dim; got {tuple(y.shape)} {y.dtype}, "
                                 f"d={w.branch.d}")
        per_branch = [_branch_args(y, w) for w in writes]
        args = (*per_branch[0], *per_branch[-1])
        return cls(writes, tuple(a[0] for a in per_branch), args, cos.float().contiguous(), sin.float().contiguous())

    @property
    def count(self) -> int:
        return sum(w.branch.hq + w.branch.hk + w.branch.hv for w in self.writes)

    @property
    def d_max(self) -> int:
        return max(w.branch.d for w in self.writes)

    def meta(self, gemma: bool) -> dict:
        b, b2 = self.writes[0].branch, self.writes[-1].branch
        return dict(HQ=b.hq, HK=b.hk, HV=b.hv, D=b.d, NORM=self.writes[0].q_weight is not None,
                    HQ2=b2.hq, HK2=b2.hk, D2=b2.d, NORM2=self.writes[-1].q_weight is not None,
                    HALF=self.cos.shape[-1], PAGE=self.writes[0].k_cache.shape[-2], GEMMA=gemma,
                    ROPE=self.cos.shape[-1] > 0, FMT=FMT_CODE[kq.kv_format_of(self.writes[0].k_cache)],
                    TWO=len(self.writes) == 2)


def _branch_args(y: torch.Tensor, w: BranchWrite) -> tuple:
    """The kernel arguments of one branch, in its order (q_out first: the caller returns it)."""
    fmt = kq.kv_format_of(w.k_cache)
    if w.v_cache is not None and kq.kv_format_of(w.v_cache) is not fmt:
        raise ValueError("K and V caches must share one format")
    v_cache = w.k_cache if w.v_cache is None else w.v_cache
    kd, ks, kgs = cache_kernel_args(w.k_cache)
    vd, vs, vgs = cache_kernel_args(v_cache)
    b = w.branch
    q_out = y.new_empty((y.shape[0], b.hq, b.d)) if w.q_out is None else w.q_out
    norm = w.q_weight is not None
    return (q_out, w.q_weight if norm else y, w.k_weight if norm else y, kd, ks, kgs, vd, vs, vgs,
            b.q_col, b.k_col, b.v_col, q_out.stride(0), q_out.stride(1),
            *_cache_strides(w.k_cache, kd, ks), *_cache_strides(v_cache, vd, vs))
