"""The fast model (fp32) against the slow float64 reference, end to end, plus capture and loading."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from m3bench.runtime.contiguous import generate, greedy_generate, prefill_logits
from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers.norm import rms_norm
from m3bench.runtime.model import CaptureSpec, M3ForCausalLM
from m3bench.runtime.reference import reference_logits
from tiny_m3 import build, random_weights, rel_err, tiny_m3_cfg


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_m3_cfg()
    w = random_weights(cfg, seed=0)
    return cfg, w, build(cfg, w)


@pytest.mark.parametrize("n", [100, 20])  # 100 tokens: 7 blocks > top-2 (sparse); 20: every block fits
def test_logits_match_reference(tiny, n):
    cfg, w, model = tiny
    ids = _ids(n, n)
    assert rel_err(prefill_logits(model, ids), reference_logits(cfg, w, ids)) < 1e-4


def test_chunked_prefill_and_page_sizes_agree(tiny):
    cfg, w, model = tiny
    ids = _ids(100, 3)
    ref = reference_logits(cfg, w, ids)
    for chunks, page in [([37, 1, 1, 61], 8), ([64, 36], 32), ([100], 16)]:
        assert rel_err(prefill_logits(model, ids, chunks, page), ref) < 1e-4


def test_greedy_continuations_match_reference(tiny):
    cfg, w, model = tiny
    prompts = [_ids(90, 4), _ids(25, 5)]
    outs = greedy_generate(model, prompts, max_new_tokens=8)
    for p, out in zip(prompts, outs):
        seq = list(p)
        for _ in range(8):
            seq.append(int(reference_logits(cfg, w, seq)[-1].argmax()))
        assert out == seq[len(p):]


def test_eos_stops_and_sampling_is_seeded(tiny):
    _, _, model = tiny
    prompt = _ids(30, 6)
    first = greedy_generate(model, [prompt], 5)[0]
    assert greedy_generate(model, [prompt], 5, eos_ids=(first[1],))[0] == first[:2]
    a = generate(model, [prompt], 6, temperature=1.0, seed=7)[0]
    assert a == generate(model, [prompt], 6, temperature=1.0, seed=7)[0]


def test_tied_embeddings_and_plain_norm_match_reference():
    cfg = tiny_m3_cfg(tie_word_embeddings=True, use_gemma_norm=False)
    w = random_weights(cfg, seed=1)
    ids = _ids(60, 7)
    assert rel_err(prefill_logits(build(cfg, w), ids), reference_logits(cfg, w, ids)) < 1e-4


def test_capture_copies_residual_stream_at_layer_inputs(tiny):
    cfg, w, model = tiny
    ids = _ids(40, 8)
    meta = build_attn_metadata([40], [40], [[0, 1, 2]], 16)
    buf = torch.full((64, 2, cfg.hidden_size), float("nan"))
    kv = KVCache(cfg, 3, 16, KVDtype.AUTO, torch.float32)
    model(torch.tensor(ids), meta.positions, meta, kv, capture=CaptureSpec((0, 2), buf))
    assert torch.equal(buf[:40, 0], w["embed_tokens.weight"].float()[torch.tensor(ids)])
    short = dataclasses.replace(cfg, num_layers=2, attn_kinds=cfg.attn_kinds[:2], mlp_kinds=cfg.mlp_kinds[:2])
    trunc = M3ForCausalLM(short)
    trunc.load_canonical({k: v for k, v in w.items() if not k.startswith(("layers.2.", "layers.3."))})
    hidden = trunc(torch.tensor(ids), meta.positions, meta, KVCache(short, 3, 16, KVDtype.AUTO, torch.float32))
    normed = rms_norm(buf[:40, 1], trunc.norm.weight, cfg.rms_norm_eps, cfg.norm)
    assert torch.allclose(normed, hidden, atol=1e-5)
    assert buf[40:].isnan().all()


def test_load_canonical_rejects_missing_and_extra_names(tiny):
    cfg, w, _ = tiny
    model = M3ForCausalLM(cfg)
    with pytest.raises(CheckpointError, match="missing"):
        model.load_canonical({k: v for k, v in w.items() if k != "layers.1.moe.router.bias"})
    with pytest.raises(CheckpointError, match="unexpected"):
        model.load_canonical({**w, "layers.0.mlp.extra.weight": torch.ones(1)})


def test_load_weights_through_a_reader(tiny):
    cfg, w, model = tiny

    class DictReader:
        def get(self, name, dtype, shard=None):
            assert shard is None
            return w[name].to(dtype)

    other = M3ForCausalLM(cfg)
    other.load_weights(DictReader())
    ids = _ids(50, 9)
    assert torch.equal(prefill_logits(other, ids), prefill_logits(model, ids))


def test_init_dummy_is_seeded_non_zero_and_sane():
    cfg = tiny_m3_cfg()
    a, b, c = M3ForCausalLM(cfg), M3ForCausalLM(cfg), M3ForCausalLM(cfg)
    a.init_dummy(3), b.init_dummy(3), c.init_dummy(4)
    for s in a.weight_slots():
        assert s.target.ne(0).all() and s.target.isfinite().all(), s.name
    ids = _ids(50, 10)
    la = prefill_logits(a, ids)
    assert torch.equal(la, prefill_logits(b, ids)) and not torch.equal(la, prefill_logits(c, ids))
    assert la.isfinite().all() and 0.1 < la.std() < 20


def test_sparse_selection_is_active_at_100_tokens_and_not_at_20():
    """Guard: top-2 vs top-16 changes the 100-token logits (so the tests above exercise selection)."""
    cfg, wide = tiny_m3_cfg(), tiny_m3_cfg(sparse=dict(sparse_topk_blocks=16))
    w = random_weights(cfg, seed=0)
    long_ids, short_ids = _ids(100, 100), _ids(20, 20)
    assert rel_err(reference_logits(cfg, w, long_ids), reference_logits(wide, w, long_ids)) > 1e-2
    assert rel_err(reference_logits(cfg, w, short_ids), reference_logits(wide, w, short_ids)) < 1e-12


def test_bf16_model_tracks_fp32():
    cfg = tiny_m3_cfg(sparse=dict(sparse_topk_blocks=16))  # no selection flips: compare numerics only
    w = random_weights(cfg, seed=0)
    ids = _ids(50, 11)
    exact = prefill_logits(build(cfg, w), ids)
    low = prefill_logits(build(cfg, w, torch.bfloat16), ids, kv_dtype=KVDtype.BF16)
    assert low.dtype == torch.float32 and low.isfinite().all()
    per_token = (low - exact).abs().amax(-1) / exact.abs().amax(-1)
    assert per_token.median() < 5e-2
