"""EagleConfig parses Eagle3 config.json strictly; SpecConfig validates and resolves its defaults."""

from __future__ import annotations

import json

import pytest

from m3bench.runtime.errors import ConfigError
from m3bench.runtime.speculative.config import (DraftKVLayout, EagleConfig, SpecConfig, default_capture_layers)
from spec_helpers import EAGLE_RAW, eagle_cfg

M3_EAGLE3 = dict(  # the shape of Inferact/MiniMax-M3-EAGLE3 (section 6 of docs/minimax-m3.md)
    architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=6144, num_attention_heads=64,
    num_key_value_heads=64, head_dim=128, intermediate_size=18432, rms_norm_eps=1e-6, rope_theta=5e6,
    vocab_size=200064, draft_vocab_size=200064, fc_norm=True, norm_output=True, num_hidden_layers=1,
    hidden_act="silu", max_position_embeddings=524288, tie_word_embeddings=False, torch_dtype="bfloat16",
    bos_token_id=200034, eos_token_id=200020, attention_bias=False, rope_scaling=None,
)


def test_m3_draft_shape():
    c = EagleConfig.from_dict(M3_EAGLE3)
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (6144, 64, 64, 128)
    assert c.q_size == c.kv_size == 8192 and c.intermediate_size == 18432
    assert c.fc_norm and c.norm_output and not c.has_vocab_map
    assert c.target_hidden_size == 6144 and c.aux_layer_ids is None and c.num_aux_layers == 3
    gqa = EagleConfig.from_dict({**M3_EAGLE3, "num_key_value_heads": 4})
    assert gqa.kv_size == 512


def test_round_trip_and_from_pretrained(tmp_path):
    c = eagle_cfg(draft_vocab_size=16, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]})
    (tmp_path / "config.json").write_text(json.dumps(c.to_dict()))
    assert EagleConfig.from_pretrained(tmp_path) == c
    assert c.has_vocab_map and c.aux_layer_ids == (1, 3, 5)
    with pytest.raises(ConfigError, match="no Eagle3 config.json"):
        EagleConfig.from_pretrained(tmp_path / "nowhere")


def test_transformers_v5_rope_parameters_and_post_norm_alias():
    raw = {k: v for k, v in EAGLE_RAW.items() if k not in ("rope_theta", "norm_output")}
    c = EagleConfig.from_dict({**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
                               "eagle_config": {"return_hidden_post_norm": True}})
    assert c.rope_theta == 5e5 and c.norm_output


@pytest.mark.parametrize("over, word", [
    ({"speculative_magic": 1}, "unknown keys: speculative_magic"),
    ({"eagle_config": {"what": 1}}, "eagle_config has unknown keys"),
    ({"eagle_config": {"norm_before_fc": True}}, "norm_before_fc"),
    ({"architectures": ["LlamaForCausalLM"]}, "unsupported draft architecture"),
    ({"num_hidden_layers": 2}, "num_hidden_layers"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling"),
    ({"num_key_value_heads": 3}, "multiple"),
    ({"draft_vocab_size": 41}, "exceeds"),
    ({"hidden_size": None}, "hidden_size"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, -2]}}, "layer ids"),
])
def test_bad_configs_are_named(over, word):
    with pytest.raises(ConfigError, match=word):
        EagleConfig.from_dict({**EAGLE_RAW, **over})


def test_default_capture_layers():
    assert default_capture_layers(60) == (2, 30, 57)
    assert default_capture_layers(7) == (2, 3, 4)
    assert default_capture_layers(6) == (0, 3, 5)
    assert default_capture_layers(4) == (0, 2, 3)
    assert default_capture_layers(1) == (0, 0, 0)
    for n in range(1, 70):
        ids = default_capture_layers(n)
        assert list(ids) == sorted(ids) and 0 <= ids[0] and ids[-1] < n


def test_spec_config_validation_and_resolution(tmp_path):
    with pytest.raises(ConfigError, match="draft_len"):
        SpecConfig(draft_dir=tmp_path, draft_len=0)
    with pytest.raises(ConfigError, match="draft_len"):
        SpecConfig(draft_dir=tmp_path, draft_len=16)
    with pytest.raises(ConfigError, match="synthetic_acceptance_length"):
        SpecConfig(draft_dir=tmp_path, draft_len=3, synthetic_acceptance_length=4.5)
    SpecConfig(draft_dir=tmp_path, draft_len=15, synthetic_acceptance_length=16.0)
    sep = SpecConfig(draft_dir=str(tmp_path))
    assert sep.draft_dir == tmp_path and sep.resolved_page_size(128) == 32
    shared = SpecConfig(draft_dir=tmp_path, draft_kv=DraftKVLayout.SHARED)
    assert shared.resolved_page_size(128) == 128
    with pytest.raises(ConfigError, match="page size"):
        SpecConfig(draft_dir=tmp_path, draft_kv=DraftKVLayout.SHARED, draft_page_size=32).resolved_page_size(128)
    draft = eagle_cfg()
    assert sep.resolved_capture_layers(60, draft) == (2, 30, 57)
    pinned = eagle_cfg(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 29, 56]})
    assert sep.resolved_capture_layers(60, pinned) == (1, 29, 56)
    assert SpecConfig(draft_dir=tmp_path, capture_layers=(3, 4, 5)).resolved_capture_layers(60, pinned) == (3, 4, 5)
    with pytest.raises(ConfigError, match="outside"):
        SpecConfig(draft_dir=tmp_path, capture_layers=(3, 4, 60)).resolved_capture_layers(60, draft)
    with pytest.raises(ConfigError, match="features"):
        SpecConfig(draft_dir=tmp_path, capture_layers=(3, 4)).resolved_capture_layers(60, draft)


def test_check_target():
    from m3bench.runtime.config import ModelConfig

    target = ModelConfig.from_dict(dict(model_type="llama", hidden_size=24, num_hidden_layers=8, num_attention_heads=4,
                                        intermediate_size=48, vocab_size=40))
    eagle_cfg(hidden_size=24).check_target(target)
    with pytest.raises(ConfigError, match="target_hidden_size"):
        eagle_cfg(target_hidden_size=32).check_target(target)
    with pytest.raises(ConfigError, match="vocab_size"):
        eagle_cfg(hidden_size=24, vocab_size=48, draft_vocab_size=48).check_target(target)
    with pytest.raises(ConfigError, match="embed_tokens"):
        eagle_cfg().check_target(target)
