"""TritonBackend (CPU interpreter) equals TorchBackend: dense and MSA layers, decode, multi-token
chunks and prefill, bf16 / fp8 / nvfp4 KV pages, fp32 and bf16 queries."""

import math

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.attention.triton_backend import TritonBackend, check_msa_layout
from m3bench.runtime.errors import ConfigError
from m3bench.runtime.kv_cache import KVCache, KVDtype

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")

P = 16
DENSE, SPARSE = 0, 1


def filled_cache(cfg, kv_dtype, seq_lens, dtype, seed):
    """A cache holding random K/V/ik for every token of every sequence, on shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [math.ceil(s / P) for s in seq_lens]
    perm = torch.randperm(sum(n_pages) + 3, generator=g).tolist()
    tables, at = [], 0
    for n in n_pages:
        tables.append(perm[at:at + n])
        at += n
    kv = KVCache(cfg, len(perm), P, kv_dtype, dtype, nvfp4_global_scale=0.01)
    full = build_attn_metadata(seq_lens, seq_lens, tables, P)
    t = sum(seq_lens)
    for layer in (DENSE, SPARSE):
        k, v = (torch.randn(t, cfg.num_kv_heads, cfg.head_dim, generator=g) for _ in range(2))
        ik = torch.randn(t, cfg.msa.index_dim, generator=g) if layer == SPARSE else None
        kv.write(layer, k.to(dtype), v.to(dtype), None if ik is None else ik.to(dtype), full.slot_mapping)
    return kv, tables


def step(cfg, kv_dtype, q_lens, seq_lens, dtype=torch.float32, seed=0):
    kv, tables = filled_cache(cfg, kv_dtype, seq_lens, dtype, seed)
    meta = build_attn_metadata(q_lens, seq_lens, tables, P)
    g = torch.Generator().manual_seed(seed + 1)
    t = sum(q_lens)
    q = torch.randn(t, cfg.num_heads, cfg.head_dim, generator=g).to(dtype)
    iq = torch.randn(t, cfg.msa.index_heads, cfg.msa.index_dim, generator=g).to(dtype)
    return kv, meta, q, iq


def both(fn_name, cfg, kv, meta, q, iq, layer):
    scale = cfg.head_dim ** -0.5
    outs = []
    for be in (TorchBackend(), TritonBackend()):
        if fn_name == "dense":
            outs.append(be.dense(layer, q, meta, kv, scale).double())
        else:
            outs.append(be.msa(layer, q, iq, meta, kv, scale, cfg.msa).double())
    return outs


CASES = {"decode": ([1, 1, 1], [70, 17, 33]), "chunks": ([3, 5, 1], [70, 21, 40]),
         "prefill": ([37, 50], [37, 66])}


@pytest.mark.parametrize("case, kv_dtype", [("decode", KVDtype.AUTO), ("decode", KVDtype.FP8),
                                             ("chunks", KVDtype.BF16), ("chunks", KVDtype.FP8),
                                             ("prefill", KVDtype.BF16)])
def test_dense_and_msa_fp32(case, kv_dtype):
    cfg = tiny_config()
    kv, meta, q, iq = step(cfg, kv_dtype, *CASES[case])
    for name, layer in (("dense", DENSE), ("msa", SPARSE)):
        want, got = both(name, cfg, kv, meta, q, iq, layer)
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (name, (got - want).abs().max())


def test_nvfp4_pages_and_msa_sparsity_matters():
    cfg = tiny_config()
    kv, meta, q, iq = step(cfg, KVDtype.NVFP4, *CASES["chunks"], seed=5)
    want, got = both("msa", cfg, kv, meta, q, iq, SPARSE)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4)
    _, dense_all = both("dense", cfg, kv, meta, q, iq, SPARSE)
    first = slice(0, 3)  # the 70-token sequence: 5 blocks, top-2 selected -> differs from dense
    assert not torch.allclose(got[first], dense_all[first], atol=1e-3)


def test_bf16_model_fp8_cache():
    cfg = tiny_config()
    kv, meta, q, iq = step(cfg, KVDtype.FP8, *CASES["chunks"], dtype=torch.bfloat16, seed=2)
    for name, layer in (("dense", DENSE), ("msa", SPARSE)):
        want, got = both(name, cfg, kv, meta, q, iq, layer)
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), name


def test_msa_layout_errors():
    cfg = tiny_config()
    with pytest.raises(ConfigError, match="tokens_per_block"):
        check_msa_layout(cfg.msa, 32)
    with pytest.raises(ConfigError, match="local block"):
        check_msa_layout(tiny_config().msa.__class__(**{**cfg.msa.__dict__, "local_blocks": 2}), P)


def test_graph_safe_flags():
    assert TritonBackend.graph_safe and not TorchBackend.graph_safe


def test_backend_choice():
    from m3bench.runtime.attention.select import (
        AttentionChoice,
        check_backend_layout,
        make_backend,
    )
    from m3bench.runtime.errors import InputError

    cfg = tiny_config()
    assert isinstance(make_backend("auto", "cpu", cfg, P), TorchBackend)
    assert isinstance(make_backend(AttentionChoice.TRITON, "cpu", cfg, P), TritonBackend)
    with pytest.raises(InputError, match="attention_backend"):
        make_backend("flash", "cpu", cfg)
    with pytest.raises(ConfigError, match="tokens_per_block"):
        make_backend("triton", "cpu", cfg, 32)  # MSA block is 16
    for bad in (8, 48, 96):
        with pytest.raises(ConfigError, match="multiple of 64"):
            check_backend_layout(TritonBackend(), cfg, bad)
    dense_only = tiny_config(num_dense_layers=2)
    for good in (16, 32, 64, 128, 192):
        check_backend_layout(TritonBackend(), dense_only, good)
