"""Fused per-head RMSNorm + partial RoPE + KV write under the Triton interpreter against the
attention layer's torch path (rms_norm, apply_rope, write_pages_ref), fresh random inputs, every
KV format, caches and outputs poisoned first."""

import pytest
import torch

from m3bench.runtime.config import NormKind
from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.kv_write import write_pages_ref
from m3bench.runtime.kernels.norm_rope import Branch, norm_rope_write
from m3bench.runtime.layers.norm import rms_norm
from m3bench.runtime.layers.rotary import RotaryEmbedding, apply_rope

from .cases import clone_pages, poisoned_pages

PAGES, PAGE = 5, 16


def _rows(c, slots):
    """The cache as fp32 rows [pages * P, H, d] and the written ones' mask."""
    x = kq.dequantize_pages(c, torch.float32)
    x = x.transpose(1, 2) if x.dim() == 4 else x[:, :, None]
    x = x.flatten(0, 1)
    written = torch.zeros(x.shape[0], dtype=torch.bool)
    written[slots] = True
    return x, written


def _same_cache(got_c, want_c, slots, dtype, fmt):
    """Rows not written keep their poison bit for bit; written rows hold the reference's values
    (exact up to the fp32 summation order of the norm: a rare one-step flip of a rounded code)."""
    got, written = _rows(got_c, slots)
    want, _ = _rows(want_c, slots)
    assert torch.equal(got[~written], want[~written])
    rel = (got[written] - want[written]).norm() / want[written].norm()
    exact = dtype == torch.float32 and fmt is kq.KVFormat.PLAIN
    assert rel < (1e-6 if exact else 2e-2)
    if not exact:  # rounded codes: almost all identical
        assert (got[written] == want[written]).float().mean() > 0.97


def _ref(y, b, qw, kw, kind, cos, sin, slots, k_cache, v_cache):
    t = y.shape[0]
    norm = (lambda x, w: x) if qw is None else (lambda x, w: rms_norm(x, w, 1e-6, kind))
    q = apply_rope(norm(y[:, b.q_col:b.q_col + b.hq * b.d].view(t, b.hq, b.d), qw), cos, sin)
    k = apply_rope(norm(y[:, b.k_col:b.k_col + b.hk * b.d].view(t, b.hk, b.d), kw), cos, sin)
    write_pages_ref(k_cache, k if len(k_cache.shape) == 4 else k[:, 0], slots)
    if b.hv:
        write_pages_ref(v_cache, y[:, b.v_col:b.v_col + b.hv * b.d].view(t, b.hv, b.d), slots)
    return q


CASES = [  # (fmt, dtype, kind, rotary, norm, index branch)
    (kq.KVFormat.PLAIN, torch.float32, NormKind.GEMMA, 16, True, False),
    (kq.KVFormat.PLAIN, torch.bfloat16, NormKind.GEMMA, 16, True, False),
    (kq.KVFormat.FP8, torch.bfloat16, NormKind.GEMMA, 16, True, True),
    (kq.KVFormat.NVFP4, torch.bfloat16, NormKind.GEMMA, 16, True, False),
    (kq.KVFormat.NVFP4, torch.bfloat16, NormKind.GEMMA, 16, True, True),
    (kq.KVFormat.PLAIN, torch.bfloat16, NormKind.PLAIN, 32, True, False),  # Qwen3-like: full rotary
    (kq.KVFormat.FP8, torch.float32, NormKind.PLAIN, 32, False, False),  # Llama-like: no qk norm
]


@pytest.mark.parametrize("fmt,dtype,kind,rotary,norm,index", CASES)
def test_norm_rope_write_matches_torch(triton_interpreter, fmt, dtype, kind, rotary, norm, index):
    g = torch.Generator().manual_seed(rotary * 7 + int(index) + len(fmt.value) + int(norm))
    d, n_tok = 32, 6
    b = Branch(0, 3 * d, 0, 3, 1, 0, d) if index else Branch(d, 4 * d, 6 * d, 3, 2, 2, d)
    y = (torch.randn(n_tok, 8 * d, generator=g) * 2).to(dtype)
    qw = (torch.randn(d, generator=g) * 0.2 + (1.0 if kind is NormKind.PLAIN else 0.0)).to(dtype) if norm else None
    kw = (torch.randn(d, generator=g) * 0.2 + (1.0 if kind is NormKind.PLAIN else 0.0)).to(dtype) if norm else None
    pos = torch.randint(0, 4000, (n_tok,), generator=g)
    cos, sin = RotaryEmbedding(rotary, 5e6, None, "cpu").cos_sin(pos)
    slots = torch.randperm(PAGES * PAGE, generator=g)[:n_tok]
    slots[2] = -1  # a padding token: nothing written
    shape = (PAGES, PAGE, d) if index else (PAGES, b.hk, PAGE, d)
    k_ref, v_ref = poisoned_pages(fmt, shape, g, dtype), poisoned_pages(fmt, shape, g, dtype)
    k_got, v_got = clone_pages(k_ref), clone_pages(v_ref)
    keep = slots >= 0
    want = _ref(y[keep], b, qw, kw, kind, cos[keep], sin[keep], slots[keep], k_ref, v_ref)
    q_out = torch.full((n_tok, b.hq, d), float("nan"), dtype=dtype)
    got = norm_rope_write(y, b, qw, kw, 1e-6, kind is NormKind.GEMMA, cos, sin, slots, k_got,
                          None if index else v_got, q_out=q_out)
    assert got is q_out
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[keep].float(), want.float(), rtol=tol, atol=tol)
    for got_c, want_c in ((k_got, k_ref), (v_got, v_ref)):
        _same_cache(got_c, want_c, slots[keep], dtype, fmt)


def test_norm_rope_write_rejects_odd_head_dims():
    y = torch.randn(2, 48)
    cos = sin = torch.zeros(2, 4)
    with pytest.raises(ValueError):
        norm_rope_write(y, Branch(0, 24, 0, 1, 1, 0, 24), None, None, 1e-6, True, cos, sin,
                        torch.zeros(2, dtype=torch.long), torch.zeros(2, 16, 24))


@pytest.mark.parametrize("fmt", [kq.KVFormat.PLAIN, kq.KVFormat.FP8, kq.KVFormat.NVFP4])
def test_both_branches_in_one_launch_equal_two_launches(triton_interpreter, fmt):
    from m3bench.runtime.kernels.norm_rope import BranchWrite, norm_rope_write_pair

    g = torch.Generator().manual_seed(len(fmt.value) + 40)
    d, n_tok, dtype = 32, 5, torch.bfloat16
    main, index = Branch(0, 4 * d, 5 * d, 4, 1, 1, d), Branch(6 * d, 8 * d, 0, 2, 1, 0, d)
    y = torch.randn(n_tok, 9 * d, generator=g).to(dtype)
    w = [(torch.randn(d, generator=g) * 0.3).to(dtype) for _ in range(4)]
    cos, sin = RotaryEmbedding(16, 1e4, None, "cpu").cos_sin(torch.randint(0, 99, (n_tok,), generator=g))
    slots = torch.tensor([3, 17, -1, 40, 77])  # one padding token
    shapes = ((PAGES, 1, PAGE, d), (PAGES, 1, PAGE, d), (PAGES, PAGE, d))
    caches = [poisoned_pages(fmt, shape, g, dtype) for shape in shapes]
    one, two = [clone_pages(c) for c in caches], [clone_pages(c) for c in caches]
    q, iq = norm_rope_write_pair(y, BranchWrite(main, w[0], w[1], one[0], one[1]), BranchWrite(index, w[2], w[3], one[2]),
                                 1e-6, True, cos, sin, slots)
    want_q = norm_rope_write(y, main, w[0], w[1], 1e-6, True, cos, sin, slots, two[0], two[1])
    want_iq = norm_rope_write(y, index, w[2], w[3], 1e-6, True, cos, sin, slots, two[2])
    assert torch.equal(q, want_q) and torch.equal(iq, want_iq)
    for a, b in zip(one, two):
        assert torch.equal(kq.dequantize_pages(a, torch.float32), kq.dequantize_pages(b, torch.float32))
