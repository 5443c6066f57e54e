"""ModelConfig parses M3 (text-only, VL wrapper, transformers-v5 flat keys) and dense families strictly."""

import copy
import json

import pytest

from m3bench.runtime.config import Activation, AttnKind, Family, MlpKind, ModelConfig, NormKind, QuantMethod
from m3bench.runtime.errors import ConfigError

M3 = dict(
    model_type="minimax_m3", architectures=["MiniMaxM3SparseForCausalLM"], hidden_size=6144, num_hidden_layers=60,
    num_attention_heads=64, num_key_value_heads=4, head_dim=128, rotary_dim=64, partial_rotary_factor=0.5,
    rope_theta=5e6, vocab_size=200064, tie_word_embeddings=False, rms_norm_eps=1e-6, use_gemma_norm=True,
    use_qk_norm=True, qk_norm_type="per_head", hidden_act="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0,
    dense_intermediate_size=12288, num_local_experts=128, num_experts_per_tok=4, intermediate_size=3072,
    n_shared_experts=1, shared_intermediate_size=3072, scoring_func="sigmoid", use_routing_bias=True,
    routed_scaling_factor=2.0, moe_layer_freq=[0, 0, 0] + [1] * 57, max_position_embeddings=524288,
    num_mtp_modules=7, bos_token_id=200034, eos_token_id=200020,
    sparse_attention_config=dict(
        sparse_attention_freq=[0, 0, 0] + [1] * 57, sparse_num_index_heads=4, sparse_index_dim=128,
        sparse_block_size=128, sparse_topk_blocks=16, sparse_score_type="max", sparse_init_block=0,
        sparse_local_block=1, sparse_disable_index_value=[1] * 57,
    ),
)


def test_real_m3_shape():
    c = ModelConfig.from_dict(M3)
    assert c.family is Family.MINIMAX_M3 and not c.vl_wrapper
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (6144, 60, 64, 4, 128)
    assert c.rotary_dim == 64 and c.norm is NormKind.GEMMA and c.qk_norm and c.activation is Activation.SWIGLUOAI
    assert c.attn_kinds[:3] == (AttnKind.DENSE,) * 3 and set(c.attn_kinds[3:]) == {AttnKind.MSA}
    assert c.mlp_kinds[:3] == (MlpKind.DENSE,) * 3 and c.moe_layers == tuple(range(3, 60))
    assert c.msa.topk_blocks == 16 and c.msa.block_size == 128 and c.msa.index_heads == 4
    assert c.moe.num_experts == 128 and c.moe.top_k == 4 and c.moe.shared_intermediate_size == 3072
    assert c.eos_token_ids == (200020,) and c.quant is QuantMethod.NONE


def test_vl_wrapper_equals_text_only():
    vl = dict(model_type="minimax_m3_vl", architectures=["MiniMaxM3SparseForConditionalGeneration"],
              text_config=M3, vision_config={"hidden_size": 1280})
    a, b = ModelConfig.from_dict(M3), ModelConfig.from_dict(vl)
    assert b.vl_wrapper and a.msa == b.msa and a.moe == b.moe and a.attn_kinds == b.attn_kinds


def test_transformers_v5_flat_keys():
    flat = {k: v for k, v in M3.items() if k not in ("sparse_attention_config", "moe_layer_freq", "rope_theta",
                                                      "rotary_dim", "partial_rotary_factor")}
    flat.update(model_type="minimax_m3_vl_text", hidden_act="silu", index_n_heads=4, index_head_dim=128,
                index_block_size=128, index_topk_blocks=16, index_local_blocks=1,
                rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
                layer_types=["full_attention"] * 3 + ["sparse_attention"] * 57,
                mlp_layer_types=["dense"] * 3 + ["sparse"] * 57)
    a, b = ModelConfig.from_dict(M3), ModelConfig.from_dict(flat)
    assert (a.msa, a.moe, a.attn_kinds, a.mlp_kinds, a.rotary_dim, a.rope_theta) == \
           (b.msa, b.moe, b.attn_kinds, b.mlp_kinds, b.rotary_dim, b.rope_theta)
    assert b.activation is Activation.SWIGLUOAI  # transformers rewrites hidden_act; the math is swigluoai


@pytest.mark.parametrize("patch, message", [
    ({"num_experts_per_tok": 200}, "num_experts_per_tok"),
    ({"num_key_value_heads": 5}, "multiple"),
    ({"model_type": "gpt2"}, "unsupported model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"moe_layer_freq": [1] * 10}, "entries"),
])
def test_inconsistent_values_are_errors(patch, message):
    raw = copy.deepcopy(M3)
    raw.update(patch)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(raw)


def test_missing_required_field():
    raw = copy.deepcopy(M3)
    del raw["vocab_size"]
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelConfig.from_dict(raw)


def test_index_heads_must_match_kv_heads():
    raw = copy.deepcopy(M3)
    raw["sparse_attention_config"]["sparse_num_index_heads"] = 8
    with pytest.raises(ConfigError, match="index head per KV head"):
        ModelConfig.from_dict(raw)


def test_dense_families(tmp_path):
    llama = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                 rms_norm_eps=1e-5, rope_theta=100000, hidden_act="silu", tie_word_embeddings=True,
                 max_position_embeddings=8192, eos_token_id=2)
    (tmp_path / "config.json").write_text(json.dumps(llama))
    c = ModelConfig.from_pretrained(tmp_path)
    assert c.family is Family.LLAMA and c.head_dim == 64 and c.rotary_dim == 64 and c.norm is NormKind.PLAIN
    assert not c.qkv_bias and not c.qk_norm and c.tie_word_embeddings and c.msa is None and c.moe is None
    qwen2 = dict(llama, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    assert ModelConfig.from_dict(qwen2).qkv_bias
    qwen3 = dict(llama, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=128)
    c3 = ModelConfig.from_dict(qwen3)
    assert c3.qk_norm and c3.head_dim == 128


def test_llama3_rope_scaling_and_unknown_scaling():
    base = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                vocab_size=100, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    assert ModelConfig.from_dict(base).rope_scaling.factor == 8.0
    base["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}
    with pytest.raises(ConfigError, match="yarn"):
        ModelConfig.from_dict(base)


def test_bad_json_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path / "missing")


def test_mxfp8_and_nvfp4_quant_configs():
    mx = dict(M3, quantization_config={"quant_method": "mxfp8", "weight_block_size": [1, 32]})
    assert ModelConfig.from_dict(mx).quant is QuantMethod.MXFP8
    nv = dict(M3, quantization_config={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"})
    assert ModelConfig.from_dict(nv).quant is QuantMethod.NVFP4
