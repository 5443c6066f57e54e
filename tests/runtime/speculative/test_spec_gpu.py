"""On a CUDA device: verification gives the CPU's results, and the bf16 draft stays near float64."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.propose import sample_draft
from m3bench.runtime.speculative.tiny_draft import random_draft_tensors
from m3bench.runtime.speculative.verify import draw_uniforms, verify_greedy, verify_sampled
from spec_helpers import eagle_cfg

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_verify_on_device_matches_cpu():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    b, k, v = 16, 4, 1000
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
    drafts = torch.multinomial(q.flatten(0, 1), 1, generator=g).view(b, k)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    greedy = torch.arange(b) % 3 == 0
    gens = [torch.Generator(device=dev).manual_seed(i) for i in range(b)]
    u = draw_uniforms(nd.tolist(), k, gens, torch.Generator(device=dev).manual_seed(99), dev)
    assert u.device.type == "cuda" and u.shape == (b, k + 1)
    got = verify_sampled(p.to(dev), q.to(dev), drafts.to(dev), nd.to(dev), greedy.to(dev), u)
    want = verify_sampled(p, q, drafts, nd, greedy, u.cpu())
    assert torch.equal(got.output_tokens.cpu(), want.output_tokens)
    assert torch.equal(verify_greedy(p.to(dev), drafts.to(dev), nd.to(dev)).output_tokens.cpu(),
                       verify_greedy(p, drafts, nd).output_tokens)
    s = sample_draft(torch.randn(b, v, device=dev), [0.0, 1.0] * (b // 2), gens,
                     torch.Generator(device=dev).manual_seed(1))
    assert s.token_ids.device.type == "cuda" and torch.allclose(s.probs.sum(-1), torch.ones(b, device=dev))


def test_bf16_draft_on_device_near_float64():
    cfg = eagle_cfg(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                    intermediate_size=512, target_hidden_size=256, vocab_size=512, draft_vocab_size=512)
    w = random_draft_tensors(cfg, 0, torch.float64)
    g = torch.Generator().manual_seed(1)
    embed = torch.randn(512, 256, generator=g, dtype=torch.float64)
    captured = torch.randn(50, 3, 256, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 512, (50,), generator=g)
    outs = []
    for dtype, dev in ((torch.float64, "cpu"), (torch.bfloat16, "cuda")):
        d = Eagle3Draft(cfg, dtype, dev)
        d.load_weights({n: t.to(dtype) for n, t in w.items()})
        d.bind_target(embed.to(dtype).to(dev), None)
        meta = build_attn_metadata([40, 10], [40, 10], [[1, 0], [2]], 32, device=dev)
        kv = DraftKV(3, 32, cfg.num_kv_heads, cfg.head_dim, KVDtype.BF16, dtype, dev)
        out = d(ids.to(dev), meta.positions, d.combine_features(captured.to(dev)), meta, kv)
        outs.append(d.compute_logits(out.hidden).double().cpu())
    err = float((outs[1] - outs[0]).abs().max() / outs[0].abs().max())
    assert err < 3e-2, err
