"""Attention metadata, the attention-backend protocol, the torch backend and MSA block selection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from m3bench.runtime.attention.metadata import AttnMetadata, build_attn_metadata

if TYPE_CHECKING:
    import torch

    from m3bench.runtime.config import MsaConfig
    from m3bench.runtime.kernels.backend import KernelBackend
    from m3bench.runtime.kv_cache import KVCache


class AttentionBackend(Protocol):
    """What the attention layer calls after writing the step's K/V/ik into the cache.

    q [T, Hq, d] and iq [T, Hi, di] hold every sequence of the step (meta.query_start_loc);
    the result is [T, Hq, d] in q's dtype. `graph_safe`: no host reads, so CUDA graphs may capture it.
    """

    graph_safe: bool

    def dense(self, layer: int, q: "torch.Tensor", meta: AttnMetadata, kv: "KVCache", scale: float
              ) -> "torch.Tensor": ...

    def msa(self, layer: int, q: "torch.Tensor", iq: "torch.Tensor", meta: AttnMetadata, kv: "KVCache",
            scale: float, m: "MsaConfig") -> "torch.Tensor": ...


def kernel_backend_of(backend) -> "KernelBackend":
    """Which implementation the layers' fused ops (norm + RoPE + KV write, residual add + norm) follow:
    the backend's `kernel_backend` (the Triton backend: Triton) unless its `fuse_ops` is off, else the
    torch reference."""
    from m3bench.runtime.kernels.backend import KernelBackend

    if not getattr(backend, "fuse_ops", True):
        return KernelBackend.TORCH
    return getattr(backend, "kernel_backend", KernelBackend.TORCH)


__all__ = ["AttentionBackend", "AttnMetadata", "build_attn_metadata", "kernel_backend_of"]
