"""Layer building blocks against hand-computed cases with small explicit numbers."""

from __future__ import annotations

import math

import pytest
import torch

from m3bench.runtime.config import Activation, MoeConfig, NormKind, RopeScaling
from m3bench.runtime.layers.activation import silu_and_mul, swigluoai
from m3bench.runtime.layers.moe import SparseMoe, route
from m3bench.runtime.layers.norm import rms_norm
from m3bench.runtime.layers.rotary import RotaryEmbedding, apply_rope, inv_frequencies

F64 = torch.float64


def test_gemma_and_plain_rms_norm():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])  # mean square 7.5
    w = torch.tensor([0.0, 0.5, -0.5, 1.0])
    r = 1 / math.sqrt(7.5)
    gemma = [1 * r * 1.0, 2 * r * 1.5, 3 * r * 0.5, 4 * r * 2.0]
    plain = [0.0, 2 * r * 0.5, 3 * r * -0.5, 4 * r * 1.0]
    assert torch.allclose(rms_norm(x, w, 0.0, NormKind.GEMMA), torch.tensor(gemma), atol=1e-6)
    assert torch.allclose(rms_norm(x, w, 0.0, NormKind.PLAIN), torch.tensor(plain), atol=1e-6)


def test_rms_norm_computes_in_fp32_and_keeps_dtype():
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.full((8,), 0.25)
    y = rms_norm(x, w, 1e-6, NormKind.GEMMA)
    xf = x.float()
    ref = (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * 1.25).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref)


def test_partial_neox_rope_hand_case():
    # head_dim 8, rotary_dim 4, theta 100: inv_freq = [1, 100^(-1/2)] = [1, 0.1]; pairs (0, 2) and (1, 3)
    assert torch.allclose(inv_frequencies(4, 100.0, None), torch.tensor([1.0, 0.1]))
    rope = RotaryEmbedding(4, 100.0, None, "cpu")
    cos, sin = rope.cos_sin(torch.tensor([2]))
    x = torch.arange(1.0, 9.0, dtype=F64).view(1, 1, 8)
    a0, a1 = 2.0, 0.2
    want = [1 * math.cos(a0) - 3 * math.sin(a0), 2 * math.cos(a1) - 4 * math.sin(a1),
            3 * math.cos(a0) + 1 * math.sin(a0), 4 * math.cos(a1) + 2 * math.sin(a1), 5, 6, 7, 8]
    assert torch.allclose(apply_rope(x, cos, sin)[0, 0], torch.tensor(want, dtype=F64), atol=1e-6)


def test_rope_position_zero_is_identity_and_2d_input_works():
    rope = RotaryEmbedding(8, 10000.0, None, "cpu")
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    cos, sin = rope.cos_sin(torch.tensor([0, 5, 9]))
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[0], x[0]) and torch.equal(y[:, 8:], x[:, 8:])
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps norms


def test_llama3_rope_scaling_three_regimes():
    s = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    base = inv_frequencies(16, 10000.0, None)
    got = inv_frequencies(16, 10000.0, s)
    for f, g in zip(base.tolist(), got.tolist()):
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4:  # high frequency: unchanged
            want = f
        elif wavelen > 64 / 1:  # low frequency: divided by the factor
            want = f / 8
        else:
            t = (64 / wavelen - 1) / (4 - 1)
            want = (1 - t) * f / 8 + t * f
        assert g == pytest.approx(want, rel=1e-6)
    assert (got < base).any() and (got == base).any()


def test_swigluoai_hand_case():
    gate = torch.tensor([-1.0, 0.5, 8.0])
    up = torch.tensor([-8.0, 0.3, 2.0])
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    want = [-1 * sig(1.702 * -1) * (-7 + 1), 0.5 * sig(1.702 * 0.5) * 1.3, 7 * sig(1.702 * 7) * 3]
    assert torch.allclose(swigluoai(gate, up, 1.702, 7.0), torch.tensor(want), atol=1e-6)


def test_silu_and_mul():
    g, u = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5])
    want = [1 / (1 + math.exp(-1)) * 3, -2 / (1 + math.exp(2)) * 0.5]
    assert torch.allclose(silu_and_mul(g, u), torch.tensor(want), atol=1e-6)


def test_router_hand_case():
    # logits = W x = [0.5, 2.0, -1.0, 0.0]; bias flips the choice to experts 2 and 0
    x = torch.tensor([[1.0, -1.0]])
    w = torch.tensor([[0.5, 0.0], [1.0, -1.0], [-1.0, 0.0], [0.0, 0.0]])
    bias = torch.tensor([0.0, -1.0, 1.0, 0.0])
    weights, ids = route(x, w, bias, top_k=2, scale=2.0)
    s0, s2 = 1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(1.0))
    assert ids[0].tolist() == [2, 0]
    assert torch.allclose(weights[0], torch.tensor([s2, s0]) / (s0 + s2) * 2.0, atol=1e-6)
    _, ids_unbiased = route(x, w, None, top_k=2, scale=2.0)
    assert ids_unbiased[0].tolist() == [1, 0]


def test_moe_block_against_per_token_loop():
    m = MoeConfig(num_experts=6, top_k=2, intermediate_size=8, shared_intermediate_size=4,
                  routed_scaling_factor=2.0, use_routing_bias=True)
    moe = SparseMoe(16, m, Activation.SWIGLUOAI, 1.702, 7.0, F64, "cpu")
    g = torch.Generator().manual_seed(0)
    for p in moe.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g, dtype=F64))
    x = torch.randn(7, 16, generator=g, dtype=F64)
    want = torch.zeros_like(x)
    for t in range(7):
        s = torch.sigmoid(moe.router_weight @ x[t])
        top = torch.topk(s + moe.router_bias, 2).indices.tolist()
        for e in top:
            gate, up = (moe.w_gate_up[e] @ x[t]).chunk(2)
            want[t] += 2.0 * s[e] / s[top].sum() * (moe.w_down[e] @ swigluoai(gate, up, 1.702, 7.0))
        sg, su = (moe.shared.gate_up.weight @ x[t]).chunk(2)
        want[t] += moe.shared.down.weight @ swigluoai(sg, su, 1.702, 7.0)
    assert torch.allclose(moe(x), want, atol=1e-10)
