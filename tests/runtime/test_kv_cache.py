"""KVCache: paged write / gather round trips in every storage format, layouts and sizes."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.config import AttnKind
from m3bench.runtime.contiguous import prefill_logits
from m3bench.runtime.kernels import kv_quant
from m3bench.runtime.kv_cache import KVCache, KVDtype, PageFormat, layer_format
from tiny_m3 import build, random_weights, rel_err, tiny_m3_cfg


def _write_random(kv: KVCache, layer: int, n: int, table: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(n, 2, 16, generator=g), torch.randn(n, 2, 16, generator=g)
    ik = torch.randn(n, 16, generator=g)
    kv.write(layer, k, v, ik, build_attn_metadata([n], [n], [table], kv.page_size).slot_mapping)
    return k, v, ik


@pytest.mark.parametrize("kv_dtype,tol", [(KVDtype.AUTO, 0.0), (KVDtype.BF16, 8e-3), (KVDtype.FP8, 7e-2),
                                          (KVDtype.NVFP4, 0.25), (KVDtype.HYBRID, 0.25)])
def test_round_trip_through_non_contiguous_pages(kv_dtype, tol):
    cfg = tiny_m3_cfg()
    kv = KVCache(cfg, num_pages=10, tokens_per_block=8, kv_dtype=kv_dtype, dtype=torch.float32)
    table = [7, 2, 9, 0, 4]
    for layer in (0, 1):  # dense layer, MSA layer
        k, v, ik = _write_random(kv, layer, 37, table, seed=layer)
        gk, gv, gik = kv.gather(layer, torch.tensor(table, dtype=torch.int32), 37)
        assert gk.shape == (2, 37, 16) and gk.dtype == torch.float32
        assert rel_err(gk, k.transpose(0, 1)) <= tol and rel_err(gv, v.transpose(0, 1)) <= tol
        assert (gik is None) == (layer == 0)
        if gik is not None:
            assert rel_err(gik, ik) <= tol


def test_storage_layouts_and_hybrid_formats():
    cfg = tiny_m3_cfg()
    kv = KVCache(cfg, num_pages=4, tokens_per_block=16, kv_dtype=KVDtype.HYBRID, dtype=torch.bfloat16)
    assert kv.k[0].data.shape == (4, 2, 16, 16) and kv.k[0].data.dtype == torch.float8_e4m3fn
    assert kv.k[1].data.shape == (4, 2, 16, 8) and kv.k[1].scales.shape == (4, 2, 16, 1)
    assert kv.ik[0] is None and kv.ik[1].data.shape == (4, 16, 8)
    assert layer_format(KVDtype.HYBRID, AttnKind.MSA) is PageFormat.NVFP4
    assert layer_format(KVDtype.HYBRID, AttnKind.DENSE) is PageFormat.FP8
    k, v, ik = kv.pages(1)
    assert isinstance(k, kv_quant.Nvfp4Pages) and k.data is kv.k[1].data and ik.scales is kv.ik[1].scales
    assert kv.pages(0)[0] is kv.k[0].data and kv.pages(0)[2] is None
    bf16 = KVCache(cfg, 4, 16, KVDtype.BF16, torch.float32)
    assert bf16.k[0].data.dtype == torch.bfloat16
    # per page: 4 layers x K+V x 2 heads x 16 tokens x 16 dims x 2 bytes + 3 MSA layers x 16 x 16 x 2
    assert KVCache.page_bytes(cfg, 16, KVDtype.BF16, torch.bfloat16) == 4 * 2 * 2 * 16 * 16 * 2 + 3 * 16 * 16 * 2
    assert bf16.nbytes == 4 * KVCache.page_bytes(cfg, 16, KVDtype.BF16, torch.bfloat16)


def test_msa_layer_write_needs_index_keys():
    kv = KVCache(tiny_m3_cfg(), 2, 16, KVDtype.AUTO, torch.float32)
    with pytest.raises(ValueError, match="index keys"):
        kv.write(1, torch.ones(1, 2, 16), torch.ones(1, 2, 16), None, torch.tensor([0]))


@pytest.mark.parametrize("kv_dtype,tol", [(KVDtype.BF16, 1e-2), (KVDtype.FP8, 0.2), (KVDtype.HYBRID, 0.3)])
def test_model_runs_on_quantized_caches(kv_dtype, tol):
    """Median per-token logit error; the random tiny model amplifies cache rounding (routing and block
    selection flip), so the round trips above are the precise checks."""
    cfg = tiny_m3_cfg()
    model = build(cfg, random_weights(cfg, seed=0))
    ids = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    exact = prefill_logits(model, ids, [30, 30])
    got = prefill_logits(model, ids, [30, 30], kv_dtype=kv_dtype)
    per_token = (got - exact).abs().amax(-1) / exact.abs().amax(-1)
    assert got.isfinite().all() and 0 < per_token.median() < tol
    if kv_dtype is KVDtype.BF16:
        assert torch.equal(got.argmax(-1), exact.argmax(-1))
