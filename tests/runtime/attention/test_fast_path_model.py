"""The GPU fast path wired into the model, on CPU under the Triton interpreter: the fused-MoE
experts equal the torch experts, and a whole M3 forward (prefill chunk, decode, verify chunk)
with TritonBackend + fused MoE equals the torch backend + torch MoE."""

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe_sum import summed
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.model import M3ForCausalLM

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")

P = 16


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fused_moe_experts_equal_torch_experts(dtype, tol):
    cfg = tiny_config()
    model = M3ForCausalLM(cfg, dtype=dtype)
    model.init_dummy(3)
    moe: SparseMoe = model.layers[1].mlp
    x = torch.randn(7, cfg.hidden_size, generator=torch.Generator().manual_seed(4)).to(dtype)
    moe.kernel_backend = KernelBackend.TORCH
    want = moe(x).double()
    moe.kernel_backend = KernelBackend.TRITON
    got = moe(x).double()
    assert torch.allclose(got, want, atol=tol, rtol=tol), (got - want).abs().max()


def _model(cfg, backend, seed=7):
    m = M3ForCausalLM(cfg, dtype=torch.float32, backend=backend)
    m.init_dummy(seed)
    return m


def _run_steps(model, steps, tables):
    kv = KVCache(model.cfg, 8, P, KVDtype.BF16, torch.float32)
    g = torch.Generator().manual_seed(11)
    outs = []
    for q_lens, seq_lens in steps:
        meta = build_attn_metadata(q_lens, seq_lens, tables, P)
        ids = torch.randint(0, model.cfg.vocab_size, (sum(q_lens),), generator=g)
        outs.append(model(ids, meta.positions, meta, kv).double())
    return outs


def test_model_triton_path_equals_torch_path():
    cfg = tiny_config()
    ref = _model(cfg, TorchBackend())
    fast = _model(cfg, TritonBackend())
    fast.layers[1].mlp.kernel_backend = KernelBackend.TRITON
    steps = [([20, 35], [20, 35]), ([1, 1], [21, 36]), ([3, 2], [24, 38])]
    tables = [[5, 1], [0, 7, 3]]
    for want, got in zip(_run_steps(ref, steps, tables), _run_steps(fast, steps, tables)):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_llm_triton_backend_generates_like_torch():
    from m3bench.runtime import LLM, SamplingParams

    cfg = tiny_config()
    prompts = [list(range(3, 3 + n)) for n in (21, 9)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = []
    for name in ("torch", "triton"):
        llm = LLM(None, load_format="dummy", config=cfg, seed=1, tokens_per_block=P, num_kv_blocks=16,
                  max_num_tokens=64, attention_backend=name)
        assert type(llm.model.backend).__name__ == ("TorchBackend" if name == "torch" else "TritonBackend")
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert outs[0] == outs[1]


def test_fused_moe_skips_other_ranks_experts():
    # Under EP, ids outside [0, local experts) belong to other ranks: both paths must skip them.
    cfg = tiny_config()
    moe: SparseMoe = M3ForCausalLM(cfg, dtype=torch.float32).layers[1].mlp
    g = torch.Generator().manual_seed(9)
    for p in (moe.w_gate_up, moe.w_down):
        p.normal_(0, p.shape[-1] ** -0.5, generator=g)
    x = torch.randn(6, cfg.hidden_size, generator=g)
    ids = torch.tensor([[0, -1], [3, 5], [2, 1], [-2, 9], [1, 1], [3, 0]])
    w = torch.rand(6, 2, generator=g)
    want = moe.torch_experts(x, w, ids).double()
    got = moe.fused_experts(x, w, ids).double()
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(got[3], torch.zeros_like(got[3]))  # no local expert at all


@pytest.mark.parametrize("n_tok", [2, 7])  # 2: the split-K skinny path
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_shared_expert_inside_the_fused_moe(n_tok, dtype, tol, monkeypatch):
    from m3bench.runtime.layers.mlp import GatedMLP

    cfg = tiny_config(hidden_size=256)  # wide enough for the skinny path to split the reduction
    moe: SparseMoe = M3ForCausalLM(cfg, dtype=dtype).layers[1].mlp
    g = torch.Generator().manual_seed(12)
    for p in (moe.w_gate_up, moe.w_down, moe.router_weight, moe.shared.gate_up.weight, moe.shared.down.weight):
        p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    if moe.router_bias is not None:  # else torch.empty's leftovers (NaN at times): routing that differs by path
        moe.router_bias.copy_(torch.randn(moe.router_bias.shape, generator=g) * 0.1)
    x = torch.randn(n_tok, cfg.hidden_size, generator=g).to(dtype)
    moe.kernel_backend = KernelBackend.TRITON
    moe.fuse_shared_from_tokens = 1  # the layer's default leaves <= 4 tokens to the shared expert's own GEMMs
    moe.fuse_shared = False
    apart = moe(x).double()
    calls = []
    real = GatedMLP.forward
    monkeypatch.setattr(GatedMLP, "forward", lambda self, h, *a, **kw: calls.append(1) or real(self, h, *a, **kw))
    moe.fuse_shared = True
    assert moe.shared_fusable(x)
    fused = moe(x).double()
    assert calls == [], "the shared expert ran its own GEMMs"
    moe.kernel_backend = KernelBackend.TORCH
    want = moe(x).double()
    assert calls == [1]
    assert torch.allclose(fused, want, atol=tol, rtol=tol), (fused - want).abs().max()
    assert torch.allclose(apart, want, atol=tol, rtol=tol), (apart - want).abs().max()


@pytest.mark.parametrize("n_tok", [3, 20])  # 20: past router_topk_align's 16 tokens, the separate launches
def test_router_aligns_for_the_fused_moe(n_tok, monkeypatch):
    from m3bench.runtime.layers import moe as moe_layer

    cfg = tiny_config()
    model = M3ForCausalLM(cfg, dtype=torch.float32)
    model.init_dummy(8)
    moe: SparseMoe = model.layers[1].mlp
    moe.kernel_backend = KernelBackend.TRITON
    x = torch.randn(n_tok, cfg.hidden_size, generator=torch.Generator().manual_seed(13))
    calls = []
    real = moe_layer.router_topk_align
    monkeypatch.setattr(moe_layer, "router_topk_align", lambda *a: calls.append(1) or real(*a))
    got = moe(x)
    assert len(calls) == (n_tok <= 16)
    moe.fuse_align = False
    assert torch.equal(got, moe(x)) and len(calls) == (n_tok <= 16)
    moe.kernel_backend = KernelBackend.TORCH
    want = moe(x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_post_attention_norm_hands_the_router_its_fp32_input(monkeypatch):
    # bf16 on the Triton backend: the router takes the norm's fp32 copy (no cast launch), same outputs.
    cfg = tiny_config()
    model = M3ForCausalLM(cfg, dtype=torch.bfloat16, backend=TritonBackend())
    model.init_dummy(9)
    layer = model.layers[1]
    layer.mlp.kernel_backend = KernelBackend.TRITON
    seen = []
    real = SparseMoe.forward
    monkeypatch.setattr(SparseMoe, "forward",
                        lambda self, y, xr=None, **kw: seen.append(xr is not None) or real(self, y, xr, **kw))
    outs = []
    for on in (True, False):
        layer.mlp.fuse_router_input = on
        kv = KVCache(cfg, 4, P, KVDtype.BF16, torch.bfloat16)
        meta = build_attn_metadata([3], [3], [[0]], P)
        h = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(14)).bfloat16()
        cos, sin = model.rope.cos_sin(meta.positions)
        h, delta = layer.forward_parts(h, layer.input_norm(h), cos, sin, meta, kv, model.backend)
        outs.append((h, summed(delta)))  # the MoE's partials, unsummed on one rank (kernels/moe_sum.py)
    assert seen == [True, False]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
