"""The Eagle3 draft forward against an independent float64 reference; checkpoint names and strictness."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.config import EagleConfig
from m3bench.runtime.speculative.draft import Eagle3Draft, write_tiny_draft
from m3bench.runtime.speculative.tiny_draft import random_draft_tensors
from spec_helpers import eagle_cfg, ref_draft, ref_features

F64 = torch.float64


def _draft(cfg: EagleConfig, seed: int = 0):
    w = random_draft_tensors(cfg, seed, F64)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    draft = Eagle3Draft(cfg, F64)
    draft.load_weights(w)
    draft.bind_target(embed, None)
    return draft, w, embed


def _kv(cfg: EagleConfig, page_size: int, pages: int = 16) -> DraftKV:
    return DraftKV(pages, page_size, cfg.num_kv_heads, cfg.head_dim, KVDtype.AUTO, F64)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> bool:
    """Relative max error; ~1e-8 is expected: the RoPE angle table is fp32 (as in every public engine)."""
    return float((a - b).abs().max() / b.abs().max()) < tol


@pytest.mark.parametrize("norm_output", [True, False])
def test_forward_matches_reference_over_two_steps(norm_output):
    cfg = eagle_cfg(norm_output=norm_output)
    draft, w, embed = _draft(cfg)
    g = torch.Generator().manual_seed(5)
    captured = torch.randn(8, 3, cfg.target_hidden_size, generator=g, dtype=F64)
    feats = draft.combine_features(captured)
    assert _close(feats, ref_features(w, cfg, captured))
    ids = torch.randint(0, cfg.vocab_size, (10,), generator=g)
    kv = _kv(cfg, page_size=4)
    # step 1: a 5-token chunk (pages 3, 1) and a 3-token chunk (page 6); step 2: one chained token each
    meta = build_attn_metadata([5, 3], [5, 3], [[3, 1], [6]], 4)
    out = draft(ids[:8], meta.positions, feats, meta, kv)
    meta2 = build_attn_metadata([1, 1], [6, 4], [[3, 1], [6]], 4)
    out2 = draft(ids[8:], meta2.positions, out.feature[[4, 7]], meta2, kv)
    for rows, extra in ((slice(0, 5), 0), (slice(5, 8), 1)):
        h, f = ref_draft(w, embed, cfg, ids[rows].tolist(), feats[rows], list(range(rows.stop - rows.start)))
        assert _close(out.hidden[rows], h) and _close(out.feature[rows], f)
        assert _close(draft.compute_logits(out.hidden[rows]), h @ w["lm_head.weight"].T)
        toks = ids[rows].tolist() + [int(ids[8 + extra])]
        h2, f2 = ref_draft(w, embed, cfg, toks, torch.cat((feats[rows], f[-1:])), list(range(len(toks))))
        assert _close(out2.hidden[extra], h2[-1]) and _close(out2.feature[extra], f2[-1])


def test_page_size_and_page_ids_do_not_change_the_output():
    """SEPARATE (page 32, own page ids) and SHARED (the target's page 128 and ids) see the same keys."""
    cfg = eagle_cfg()
    draft, _, _ = _draft(cfg)
    g = torch.Generator().manual_seed(9)
    feats = torch.randn(40, cfg.hidden_size, generator=g, dtype=F64)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=g)
    outs = []
    for page, tables in ((32, [[5, 2], [0]]), (128, [[1], [3]])):
        meta = build_attn_metadata([33, 7], [33, 7], tables, page)
        outs.append(draft(ids, meta.positions, feats, meta, _kv(cfg, page, pages=8)).hidden)
    assert _close(outs[0], outs[1], 1e-12)


def _target_dir(tmp_path, vocab: int = 48, hidden: int = 32):
    raw = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden, num_hidden_layers=8,
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=vocab,
               rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512)
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    return d


def _run(draft: Eagle3Draft, seed: int = 2) -> torch.Tensor:
    c = draft.cfg
    g = torch.Generator().manual_seed(seed)
    captured = torch.randn(6, 3, c.target_hidden_size, generator=g, dtype=F64)
    meta = build_attn_metadata([6], [6], [[0]], 32)
    ids = torch.randint(0, c.vocab_size, (6,), generator=g)
    kv = _kv(c, 32, pages=1)
    return draft.compute_logits(draft(ids, meta.positions, draft.combine_features(captured), meta, kv).hidden)


def test_tiny_draft_and_name_schemes(tmp_path):
    target = _target_dir(tmp_path)
    cfg_a = write_tiny_draft(tmp_path / "a", target, seed=3)
    cfg_b = write_tiny_draft(tmp_path / "b", target, seed=3, midlayer_names=True)
    names_b = set(load_file(str(tmp_path / "b" / "model.safetensors")))
    assert any(n.startswith("midlayer.") for n in names_b) and not any(n.startswith("layers.") for n in names_b)
    assert cfg_a == cfg_b == EagleConfig.from_pretrained(tmp_path / "a")
    assert cfg_a.aux_layer_ids == (2, 4, 5) and cfg_a.hidden_size == cfg_a.target_hidden_size == 32
    # a `model.` prefix on every name is accepted too, and a shipped embedding is ignored (the target's is shared)
    prefixed = {f"model.{k}": v for k, v in load_file(str(tmp_path / "a" / "model.safetensors")).items()}
    prefixed["model.embed_tokens.weight"] = torch.full((48, 32), float("nan"), dtype=torch.bfloat16)
    (tmp_path / "c").mkdir()
    save_file(prefixed, str(tmp_path / "c" / "model.safetensors"))
    embed = torch.randn(48, 32, dtype=F64)
    logits = []
    for src in ("a", "b", "c"):
        d = Eagle3Draft(cfg_a, F64)
        d.load_weights(tmp_path / src)
        d.bind_target(embed, None)
        logits.append(_run(d))
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])


def test_reduced_draft_vocabulary_maps_to_target_ids(tmp_path):
    cfg = write_tiny_draft(tmp_path / "d", _target_dir(tmp_path), seed=4, draft_vocab_size=10)
    d = Eagle3Draft(cfg, F64)
    d.load_weights(tmp_path / "d")
    d.bind_target(torch.randn(48, 32, dtype=F64), None)
    t2d = load_file(str(tmp_path / "d" / "model.safetensors"))["t2d"]
    mapped = d.to_target_ids(torch.arange(10))
    assert torch.equal(mapped, t2d.nonzero().squeeze(1)) and bool((mapped.diff() > 0).all())
    q = torch.softmax(_run(d), dim=-1)
    qt = d.probs_to_target(q)
    assert qt.shape == (6, 48) and torch.allclose(qt.sum(-1), torch.ones(6, dtype=F64))
    assert torch.equal(qt[:, mapped], q) and float(qt[:, ~t2d].abs().max()) == 0.0


def test_checkpoint_is_checked_strictly():
    cfg = eagle_cfg()
    good = random_draft_tensors(cfg, 0, F64)
    cases = {
        "missing": {k: v for k, v in good.items() if k != "layers.0.hidden_norm.weight"},
        "unexpected": {**good, "layers.0.self_attn.q_norm.weight": torch.ones(8)},
        "mis-shaped": {**good, "fc.weight": torch.ones(32, 48)},
    }
    for word, tensors in cases.items():
        with pytest.raises(CheckpointError, match=word):
            Eagle3Draft(cfg, F64).load_weights(tensors)
    twice = {**good, "midlayer.hidden_norm.weight": good["layers.0.hidden_norm.weight"]}
    with pytest.raises(CheckpointError, match="two names"):
        Eagle3Draft(cfg, F64).load_weights(twice)


def test_lm_head_comes_from_the_target_when_absent():
    cfg = eagle_cfg()
    w = {k: v for k, v in random_draft_tensors(cfg, 0, F64).items() if k != "lm_head.weight"}
    d = Eagle3Draft(cfg, F64)
    d.load_weights(w)
    embed, head = torch.randn(40, 32, dtype=F64), torch.randn(40, 32, dtype=F64)
    with pytest.raises(CheckpointError):
        d.bind_target(embed, None)
    d.bind_target(embed, head)
    h = torch.randn(3, 32, dtype=F64)
    assert torch.equal(d.compute_logits(h), h @ head.T)
    with pytest.raises(CheckpointError):
        d.bind_target(torch.randn(41, 32, dtype=F64), head)


def test_tiny_draft_fits_the_tiny_m3_checkpoint(tmp_path):
    """For the VL-wrapped tiny M3 checkpoint (`m3bench checkpoint tiny`), the draft matches its text config."""
    from m3bench.runtime.config import ModelConfig
    from m3bench.runtime.tiny import Layout, write_tiny_checkpoint

    target = write_tiny_checkpoint(tmp_path / "m3", seed=0, layout=Layout.VL)
    tc = ModelConfig.from_pretrained(target)
    cfg = write_tiny_draft(tmp_path / "eagle3", target, seed=1)
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.vocab_size) == (tc.hidden_size, tc.hidden_size, tc.vocab_size)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (tc.num_heads, tc.num_kv_heads, tc.head_dim)
    d = Eagle3Draft(EagleConfig.from_pretrained(tmp_path / "eagle3"), F64)
    d.load_weights(tmp_path / "eagle3")
    d.bind_target(torch.randn(tc.vocab_size, tc.hidden_size, dtype=F64), None)
    assert torch.isfinite(_run(d)).all()
