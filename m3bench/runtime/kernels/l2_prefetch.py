"""Pull weights into L2 ahead of the GEMM that reads them (kernels/l2_prefetch_triton.py).

    l2_prefetch(weight, ...)   # one launch per tensor's storage; a hint: nothing where it cannot run

At a TP8/EP8 rank's decode shapes a layer's attention and its MoE router chain are latency-bound: HBM idles
while they run. Launched on the prefetch lane (kernels/lanes.py) beside them, a bulk prefetch of the weights of
the GEMM that follows (o_proj; the next layer's qkv + index projection) lets that GEMM read them from L2.
Runs on CUDA sm90+ only (not under the interpreter, which cannot run PTX); elsewhere it does nothing.
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels.backend import interpreting, pdl_args, sm_capability

PREFETCH_MAX_TOKENS = 16  # the layers prefetch at up to this many tokens (decode; more tokens keep HBM busy)
CHUNK_BYTES = 16384  # bytes one bulk prefetch asks for
LANES = 128  # prefetches a program issues (2 MB a program)


def l2_prefetch_supported(t: torch.Tensor) -> bool:
    return t.is_cuda and not interpreting() and sm_capability(t.device.index or 0) >= (9, 0)


def prefetch_span(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(a uint8 tensor over t's whole storage from its first 16-byte boundary, the bytes to prefetch: a multiple of
    16): a view or a block-major layout prefetches the storage it lives in."""
    storage = t.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),))
    skip = -storage.data_ptr() % 16
    return raw[skip:], (storage.nbytes() - skip) // 16 * 16


def prefetch_grid(nbytes: int) -> int:
    return max(1, -(-nbytes // (CHUNK_BYTES * LANES)))


def l2_prefetch(*tensors: torch.Tensor | None) -> None:
    """Ask L2 for each tensor's storage (None skipped)."""
    from m3bench.runtime.kernels.l2_prefetch_triton import l2_prefetch_kernel

    for t in tensors:
        if t is None or not l2_prefetch_supported(t):
            continue
        raw, nbytes = prefetch_span(t)
        if nbytes:
            l2_prefetch_kernel[(prefetch_grid(nbytes),)](raw, nbytes, CHUNK=CHUNK_BYTES, LANES=LANES, num_warps=4,
                                                         **pdl_args(raw))
