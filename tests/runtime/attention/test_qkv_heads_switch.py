"""Attention.fuse_qkv_heads: at skinny rows the q|k|v(|index) projection ends in its heads' norm + RoPE + cache
write (kernels.skinny_heads, one launch for two); Attention.index_beside: an MSA layer's index branch (projection,
norm / RoPE / write, block scores, top-k) on a side lane beside q|k|v (inline in order off CUDA). The tiny M3 in
bf16 on the Triton backend (interpreter; the skinny GEMMs allowed on CPU as they run on CUDA by themselves) gives
the same hidden states and caches with each on and off, within the rounding of the projections' other tiles, and
takes them only where they apply."""

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels import skinny
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers import attention, linear
from m3bench.runtime.model import M3ForCausalLM

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def heads_calls(monkeypatch):
    """Skinny GEMMs on CPU tensors (the interpreter); the fused launches counted."""
    calls, real = [], attention.skinny_heads

    def runs(x, weight, rows):
        return bool(rows) and skinny.skinny_supported(x, weight, rows)

    def counted(*args, **kwargs):
        calls.append(args[3][0].branch.hq)
        return real(*args, **kwargs)

    monkeypatch.setattr(linear, "skinny_runs", runs)
    monkeypatch.setattr(attention, "skinny_runs", runs)
    monkeypatch.setattr(attention, "skinny_heads", counted)
    return calls


def _step(fuse: bool, kv_dtype: KVDtype, query_lens: list[int], beside: bool = False):
    m = M3ForCausalLM(tiny_config(), dtype=torch.bfloat16, backend=TritonBackend())
    m.init_dummy(7)
    for layer in m.layers:
        layer.attn.fuse_qkv_heads = fuse
        layer.attn.index_beside = beside
    kv = KVCache(m.cfg, 12, 16, kv_dtype, torch.bfloat16)
    _fill(kv)  # 60 earlier tokens a sequence, random: 4-5 blocks, of which the MSA layer selects 2 (top-k)
    meta = build_attn_metadata(query_lens, [q + 60 for q in query_lens], [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (sum(query_lens),), generator=torch.Generator().manual_seed(3))
    return m(ids, meta.positions, meta, kv), kv


def _fill(kv: KVCache) -> None:
    """Random pages (NVFP4: random codes, scales in [0.25, 2)), the same in every run."""
    g = torch.Generator().manual_seed(11)
    for store in [*kv.k, *kv.v, *(s for s in kv.ik if s is not None)]:
        if store.scales is None:
            store.data.copy_(torch.randn(store.data.shape, generator=g).to(store.data.dtype))
        else:
            store.data.copy_(torch.randint(0, 256, store.data.shape, generator=g, dtype=torch.uint8))
            store.scales.copy_((torch.rand(store.scales.shape, generator=g) * 1.75 + 0.25).to(store.scales.dtype))


def _pages(kv: KVCache, layer: int):
    return [kq.dequantize_pages(p, torch.float32) for p in kv.pages(layer) if p is not None]


@pytest.mark.parametrize("kv_dtype", [KVDtype.BF16, KVDtype.FP8])
def test_fused_heads_give_the_same_step(heads_calls, kv_dtype):
    got, kv_got = _step(True, kv_dtype, [3, 1])
    assert len(heads_calls) == 2  # the dense layer and the MSA layer, one launch each
    want, kv_want = _step(False, kv_dtype, [3, 1])
    assert len(heads_calls) == 2
    scale = want.float().abs().max()
    assert (got.float() - want.float()).abs().max() <= 3e-2 * scale
    for layer in range(2):
        for a, b in zip(_pages(kv_got, layer), _pages(kv_want, layer)):
            assert (a - b).abs().max() <= 5e-2 * b.abs().max()


def test_more_rows_than_heads_max_rows_stay_on_two_launches(heads_calls):
    _step(True, KVDtype.BF16, [3, 2])  # 5 rows: skinny GEMMs, but norm_rope_write's program a row and head
    assert heads_calls == []


def test_hybrid_caches_stay_on_two_launches(heads_calls):
    """MSA layers with NVFP4 K / V and index keys: one format, fused; the dense layer's FP8: fused too."""
    _step(True, KVDtype.HYBRID, [1, 1])
    assert len(heads_calls) == 2


def _msa_select_calls() -> list:
    """What TritonBackend.msa adds to beside_calls for the MSA layer (1): its top-k in its own launch (msa_select), or
    nothing where it selects in the attention launch (SELECT_IN_ATTENTION, the default)."""
    return [] if TritonBackend().select_in_attention else [1]


@pytest.fixture
def beside_calls(monkeypatch, heads_calls):
    """The MSA layers' attention as one call (TritonBackend.msa, None) or apart (msa_select, the layer) in order."""
    calls = []
    real_msa, real_select = TritonBackend.msa, TritonBackend.msa_select

    def whole(self, *args, **kwargs):
        calls.append(None)
        return real_msa(self, *args, **kwargs)

    def apart(self, *args, **kwargs):
        calls.append(args[0])
        return real_select(self, *args, **kwargs)

    monkeypatch.setattr(TritonBackend, "msa", whole)
    monkeypatch.setattr(TritonBackend, "msa_select", apart)
    return calls


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("kv_dtype", [KVDtype.FP8, KVDtype.HYBRID])
def test_index_branch_beside_gives_the_same_step(beside_calls, heads_calls, fuse, kv_dtype):
    got, kv_got = _step(fuse, kv_dtype, [3, 1], beside=True)
    assert beside_calls == [1]  # the MSA layer (layer 1), apart
    assert len(heads_calls) == (3 if fuse else 0)  # dense: both branches in one; MSA: one launch a lane
    want, kv_want = _step(False, kv_dtype, [3, 1])
    assert beside_calls == [1, None, *_msa_select_calls()]
    assert (got.float() - want.float()).abs().max() <= 3e-2 * want.float().abs().max()
    for layer in range(2):
        for a, b in zip(_pages(kv_got, layer), _pages(kv_want, layer)):
            assert (a - b).abs().max() <= 5e-2 * b.abs().max()


def test_index_branch_beside_only_at_few_rows(beside_calls):
    _step(False, KVDtype.BF16, [3, 2], beside=True)  # 5 rows: the fused qkv GEMM, then msa
    assert beside_calls == [None, *_msa_select_calls()]
