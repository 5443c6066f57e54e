"""Native MXFP8 weights: the published MXFP8 layout loads as fp8 + E8M0, and the model computes what
the same weights dequantized compute (tiny checkpoints of runtime/tiny_quant.py, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.llm import LLM, SamplingParams
from m3bench.runtime.tiny import Layout, write_tiny_checkpoint
from m3bench.runtime.tiny_quant import TinyQuant

PROMPTS = [[5, 17, 300, 42, 9], list(range(100, 140))]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)


@pytest.fixture(scope="module")
def mx_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mx"), seed=3, layout=Layout.VL, shards=3,
                                 weights=TinyQuant.MXFP8)


@pytest.fixture(scope="module")
def nv_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("nv"), seed=3, layout=Layout.VL, shards=2,
                                 weights=TinyQuant.NVFP4)


def _run(path, dtype: str, weights_dtype: str, load_format: str = "auto"):
    llm = LLM(path, dtype=dtype, weights_dtype=weights_dtype, load_format=load_format, num_kv_blocks=8)
    outs = llm.generate(PROMPTS, GREEDY)
    return llm, [o.token_ids for o in outs], torch.tensor([lp for o in outs for lp in o.logprobs])


def test_published_layout_on_disk(mx_dir):
    index = json.loads((mx_dir / "model.safetensors.index.json").read_text())["weight_map"]
    key = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight"
    assert key in index and key + "_scale_inv" in index and len(set(index.values())) == 3
    assert "language_model.model.embed_tokens.weight_scale_inv" not in index


def test_loader_keeps_fp8_and_e8m0(mx_dir):
    llm, _, _ = _run(mx_dir, "float32", "auto")
    layer = llm.model.layers[1]
    assert layer.attn.qkv.weight.dtype == torch.float8_e4m3fn and layer.attn.qkv.weight_scale.dtype == torch.uint8
    assert layer.attn.qkv.weight_scale.shape == (layer.attn.qkv.weight.shape[0], 256 // 32)
    assert layer.mlp.w_gate_up.dtype == torch.float8_e4m3fn and layer.mlp.w_down_scale.shape == (8, 256, 128 // 32)
    assert layer.mlp.shared.down.weight.dtype == torch.float8_e4m3fn
    assert llm.model.embed_tokens.dtype == torch.float32 and layer.mlp.router_weight.dtype == torch.float32
    from safetensors import safe_open

    f = next(p for p in sorted(mx_dir.glob("*.safetensors"))
             if "language_model.model.layers.1.self_attn.q_proj.weight" in safe_open(str(p), "pt").keys())
    stored = safe_open(str(f), "pt").get_tensor("language_model.model.layers.1.self_attn.q_proj.weight")
    from m3bench.runtime import quant

    loaded = layer.attn.qkv.weight[:stored.shape[0]]  # block-major (MX_LAYOUT) or row-major
    loaded = quant.row_major(loaded) if loaded.dim() == 3 else loaded
    assert torch.equal(loaded.view(torch.uint8), stored.view(torch.uint8))


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-4), ("bfloat16", 0.05)])
def test_mxfp8_model_equals_dequantized(mx_dir, dtype, atol):
    _, tok_mx, lp_mx = _run(mx_dir, dtype, "auto")
    llm_bf, tok_bf, lp_bf = _run(mx_dir, dtype, "bfloat16")
    assert llm_bf.model.layers[1].attn.qkv.weight.dtype == getattr(torch, dtype)
    assert tok_mx == tok_bf
    assert (lp_mx - lp_bf).abs().max() <= atol


def test_nvfp4_experts_run_natively(nv_dir):
    """The ModelOpt mixed release: routed experts stay NVFP4 (packed E2M1 + e4m3 + global), the rest MXFP8;
    the model computes what the same weights dequantized compute."""
    llm, tok_nv, lp_nv = _run(nv_dir, "float32", "auto")
    moe = llm.model.layers[2].mlp
    assert moe.w_gate_up.dtype == torch.uint8 and moe.w_gate_up.shape == (8, 256, 128)
    assert moe.w_gate_up_scale.dtype == torch.float8_e4m3fn and moe.w_down_global.shape == (8, 256)
    assert llm.model.layers[2].attn.qkv.weight.dtype == torch.float8_e4m3fn
    assert len(set(moe.w_gate_up_global[0].tolist())) == 2  # gate (w1) and up (w3) keep their own globals
    _, tok_deq, lp_deq = _run(nv_dir, "float32", "bfloat16")
    assert tok_nv == tok_deq and (lp_nv - lp_deq).abs().max() <= 1e-4


def test_dummy_load_builds_mxfp8_at_config_shapes(mx_dir):
    llm, toks, lps = _run(mx_dir, "float32", "auto", load_format="dummy")
    w = llm.model.layers[0].mlp.down
    assert w.weight.dtype == torch.float8_e4m3fn and w.weight_scale.shape == (256, 512 // 32)
    assert w.weight.float().abs().sum() > 0 and all(len(t) == 8 for t in toks) and torch.isfinite(lps).all()


def test_dummy_load_builds_nvfp4_experts(nv_dir):
    llm, toks, lps = _run(nv_dir, "float32", "auto", load_format="dummy")
    moe = llm.model.layers[1].mlp
    assert moe.w_down.dtype == torch.uint8 and moe.w_down_global.min() > 0 and torch.isfinite(lps).all()


def test_unknown_weights_dtype(mx_dir):
    with pytest.raises(InputError, match="weights_dtype"):
        LLM(mx_dir, weights_dtype="int4", num_kv_blocks=8)


def test_mxfp8_needs_32_aligned_inputs(tmp_path):
    from m3bench.runtime.tiny import TinySpec

    spec = TinySpec(vocab_size=2048, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=12, rotary_dim=4,
                    dense_intermediate_size=96, intermediate_size=32, shared_intermediate_size=32, index_dim=12)
    path = write_tiny_checkpoint(tmp_path / "odd", seed=0, spec=spec)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp8", "weight_block_size": [1, 32]}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="multiple of 32 inputs"):
        LLM(path, load_format="dummy", num_kv_blocks=8)
    LLM(path, load_format="dummy", num_kv_blocks=8, weights_dtype="bfloat16")  # dequantized: any shape


def test_block_major_layout_computes_the_same(mx_dir, monkeypatch):
    """MX_LAYOUT BLOCK_MAJOR: every MXFP8 weight re-laid after loading (quant.block_major), same tokens and
    logprobs as row-major; set_mx_layout back to row-major restores the stored bytes."""
    from m3bench.runtime import quant
    from m3bench.runtime.layers import weight_format as wf

    monkeypatch.setitem(wf.MX_LAYOUT, "layout", wf.MxLayout.ROW_MAJOR)
    _, want_ids, want_lp = _run(mx_dir, "float32", "auto")
    monkeypatch.setitem(wf.MX_LAYOUT, "layout", wf.MxLayout.BLOCK_MAJOR)
    llm, ids, lp = _run(mx_dir, "float32", "auto")
    layer = llm.model.layers[1]
    assert layer.attn.qkv.weight.dim() == 3 and layer.mlp.w_gate_up.dim() == 4 and layer.mlp.w_down.dim() == 4
    assert layer.mlp.w_gate_up.stride(-2) == layer.mlp.w_gate_up.shape[1] * quant.MX_BLOCK  # blocks of all rows
    assert ids == want_ids and torch.equal(lp, want_lp)
    assert wf.set_mx_layout(llm.model, wf.MxLayout.ROW_MAJOR) > 0 and layer.attn.qkv.weight.dim() == 2
    assert wf.set_mx_layout(llm.model, wf.MxLayout.ROW_MAJOR) == 0
