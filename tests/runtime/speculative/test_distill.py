"""speculative/distill: the training forward equals the inference draft (extend, then the chain, as the
runtime runs them), and distillation teaches a draft its target's continuations."""

from __future__ import annotations

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.distill import (
    IGNORE, DistillConfig, Features, capture_features, distill_draft, draft_accuracy, draft_forward,
)
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.tiny_draft import random_draft_tensors, tiny_draft_config
from engine_spec_helpers import LLM, SamplingParams, small_model
from spec_helpers import eagle_cfg

F64 = torch.float64


def _inference(cfg, w, embed, head, ids: torch.Tensor, feats: torch.Tensor, end: int, k_steps: int):
    """Extend over positions 0..end-1 (token ids[p+1], feature p), then k_steps-1 chained steps fed the
    true next tokens: the logits of the extend's last row and of each chain step."""
    draft = Eagle3Draft(cfg, F64)
    draft.load_weights({**w, "lm_head.weight": head})
    draft.bind_target(embed, None)
    kv = DraftKV(8, 4, cfg.num_kv_heads, cfg.head_dim, KVDtype.AUTO, F64)
    table = [[3, 0, 5, 1, 7, 2, 6, 4]]
    meta = build_attn_metadata([end], [end], table, 4)
    out = draft(ids[1:end + 1], meta.positions, draft.combine_features(feats[:end]), meta, kv)
    logits = [draft.compute_logits(out.hidden[-1:])]
    feature = out.feature[-1:]
    for i in range(1, k_steps):
        meta = build_attn_metadata([1], [end + i], table, 4)
        out = draft(ids[end + i:end + i + 1], meta.positions, feature, meta, kv)
        logits.append(draft.compute_logits(out.hidden))
        feature = out.feature
    return torch.cat(logits)


def test_training_forward_equals_the_inference_draft():
    cfg = eagle_cfg()
    g = torch.Generator().manual_seed(3)
    w = random_draft_tensors(cfg, 1, F64, with_lm_head=False)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g, dtype=F64)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g, dtype=F64) / cfg.hidden_size ** 0.5
    t = 14
    ids = torch.randint(0, cfg.vocab_size, (2, t), generator=g)
    feats = torch.randn(2, t, 3, cfg.target_hidden_size, generator=g, dtype=F64)
    train = draft_forward(w, cfg, embed, head, ids, feats, unroll=3)
    assert [s.shape[1] for s in train] == [t - 2, t - 3, t - 4]
    for b in range(2):
        for end in (1, 5, 9):  # the chain after an extend whose last position is end - 1
            ref = _inference(cfg, w, embed, head, ids[b], feats[b], end, 3)
            got = torch.stack([train[k][b, end - 1] for k in range(3)])
            assert float((got - ref).abs().max() / ref.abs().max()) < 1e-9


def test_distillation_learns_the_targets_continuations(tmp_path):
    """A small M3 target's greedy continuations: after training the draft's teacher-forced accuracy on them is
    far above the random draft's (the loss falls), with hard and with soft labels."""
    model = small_model(seed=0)
    llm = LLM(model, kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 90, (6,), generator=g).tolist() for _ in range(16)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    seqs = [p + o.token_ids for p, o in zip(prompts, outs)]
    cfg = tiny_draft_config(model.cfg)
    for soft in (False, True):
        data = capture_features(model, seqs, cfg.aux_layer_ids, [len(p) for p in prompts], teacher=soft)
        assert (data.labels[:, :6] == IGNORE).all() and (data.labels[:, 6:] == data.ids[:, 6:]).all()
        embed, head = model.embed_tokens, model.lm_head_weight()
        before = draft_accuracy(random_draft_tensors(cfg, 0, torch.float32, with_lm_head=False), cfg, embed, head,
                                data, 2)
        w = distill_draft(data, cfg, embed, head, DistillConfig(steps=60, batch_size=8, unroll=2, lr=1e-2))
        after = draft_accuracy(w, cfg, embed, head, data, 2)
        assert after[0] > before[0] + 0.3, (soft, before, after)


def test_features_pad_and_mask():
    model = small_model(seed=1)
    data = capture_features(model, [[1, 2, 3, 4, 5], [6, 7, 8]], (0, 1, 2), [2, 1])
    assert isinstance(data, Features) and data.ids.shape == (2, 5) and data.teacher is None
    assert data.labels.tolist() == [[IGNORE, IGNORE, 3, 4, 5], [IGNORE, 7, 8, IGNORE, IGNORE]]
    assert (data.feats[1, 3:] == 0).all() and data.feats[1, :3].abs().sum() > 0
