"""Random paged-KV test cases shared by the kernel tests (fresh random data, never zeros)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels import kv_quant as kq


@dataclass(frozen=True)
class PagedCase:
    q: torch.Tensor
    k_cache: kq.PagedTensor
    v_cache: kq.PagedTensor
    ik_cache: kq.PagedTensor
    iq: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    n_tokens: int  # real tokens; q may carry padding rows after them


def _store(x: torch.Tensor, fmt: kq.KVFormat, dtype) -> kq.PagedTensor:
    if fmt is kq.KVFormat.FP8:
        return kq.quantize_fp8(x)
    if fmt is kq.KVFormat.NVFP4:
        gs = kq.nvfp4_global_scale(x.abs().amax()).reshape(1)
        return kq.Nvfp4Pages(*kq.quantize_nvfp4(x, gs), gs)
    return x.to(dtype)


def make_case(seed, q_lens, seq_lens, hq=4, hkv=2, d=32, page=16, hi=None, di=32,
              fmt=kq.KVFormat.PLAIN, dtype=torch.float32, pad_tokens=1) -> PagedCase:
    """Requests with the given query / context lengths on shuffled pages of one pool."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [math.ceil(n / page) for n in seq_lens]
    max_pages = max(n_pages) + 1
    pool = sum(n_pages) + 3
    perm = torch.randperm(pool, generator=g).to(torch.int32)
    tables = torch.full((len(seq_lens), max_pages), pool - 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(n_pages):
        tables[b, :n] = perm[used:used + n]
        used += n
    n_tok = sum(q_lens)
    rnd = lambda *s: torch.randn(*s, generator=g)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedCase(
        q=rnd(n_tok + pad_tokens, hq, d).to(dtype),
        k_cache=_store(rnd(pool, hkv, page, d), fmt, dtype),
        v_cache=_store(rnd(pool, hkv, page, d), fmt, dtype),
        ik_cache=_store(rnd(pool, page, di), fmt, dtype),
        iq=rnd(n_tok + pad_tokens, hi or hkv, di).to(dtype),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=qsl,
        n_tokens=n_tok,
    )


def poisoned_pages(fmt: kq.KVFormat, shape: tuple[int, ...], g: torch.Generator, dtype=torch.bfloat16,
                   device: str | torch.device = "cpu") -> kq.PagedTensor:
    """A cache of `fmt` full of garbage (x 9), so a row a kernel should not write shows as changed if it does."""
    raw = torch.randn(shape, generator=g, device=device) * 9
    if fmt is kq.KVFormat.FP8:
        return kq.quantize_fp8(raw)
    if fmt is kq.KVFormat.NVFP4:
        gs = torch.tensor([0.05], device=device)
        return kq.Nvfp4Pages(*kq.quantize_nvfp4(raw, gs), gs)
    return raw.to(dtype)


def clone_pages(c: kq.PagedTensor) -> kq.PagedTensor:
    if isinstance(c, kq.Nvfp4Pages):
        return kq.Nvfp4Pages(c.data.clone(), c.scales.clone(), c.global_scale)
    return c.clone()


def same_pages(a: kq.PagedTensor, b: kq.PagedTensor) -> bool:
    """The two caches hold the same bytes (codes and scales)."""
    parts = lambda c: (c.data, c.scales) if isinstance(c, kq.Nvfp4Pages) else (c,)  # noqa: E731
    return all(torch.equal(x, y) for x, y in zip(parts(a), parts(b)))
