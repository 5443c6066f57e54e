"""Every published MiniMax-M3 config dialect parses to the same model shape (tests/fixtures/minimax-m3)."""

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from m3bench.runtime.config import ModelConfig, QuantMethod
from m3bench.runtime.errors import ConfigError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "minimax-m3"
# Fields that differ between dialects by design; everything else is the model's shape.
NOT_SHAPE = ("architecture", "vl_wrapper", "quant", "max_position_embeddings")


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def shape(cfg: ModelConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SHAPE}


def transformers_dialect(quantization_config: dict | None = None) -> dict:
    """What transformers' own MiniMaxM3VLConfig(...).to_dict() writes for the published values."""
    tr = pytest.importorskip("transformers")
    cls = getattr(tr, "MiniMaxM3VLConfig", None)
    if cls is None:
        pytest.skip(f"transformers {tr.__version__} has no MiniMaxM3VLConfig")
    vl = load("vl-bf16.json")
    kwargs = {"quantization_config": quantization_config} if quantization_config else {}
    return json.loads(json.dumps(cls(text_config=vl["text_config"], vision_config=vl["vision_config"],
                                     **kwargs).to_dict()))


def test_published_files_give_one_shape():
    ref = ModelConfig.from_dict(load("text-only.json"))
    assert not ref.vl_wrapper and ref.max_position_embeddings == 1048576 and ref.quant is QuantMethod.NONE
    for name, quant in (("vl-bf16.json", QuantMethod.NONE), ("vl-mxfp8.json", QuantMethod.MXFP8),
                        ("vl-nvfp4.json", QuantMethod.NVFP4)):
        cfg = ModelConfig.from_pretrained(FIXTURES / name)
        assert cfg.vl_wrapper and cfg.quant is quant and cfg.max_position_embeddings == 524288, name
        assert shape(cfg) == shape(ref), name
    assert ref.sparse_layers == tuple(range(3, 60)) and ref.moe_layers == tuple(range(3, 60))


def test_transformers_dialect_gives_the_same_shape():
    d = transformers_dialect()
    assert d["model_type"] == "minimax_m3_vl" and d["text_config"]["model_type"] == "minimax_m3_vl_text"
    assert "sparse_attention_config" not in d["text_config"] and "index_topk_blocks" in d["text_config"]
    cfg = ModelConfig.from_dict(d)
    assert shape(cfg) == shape(ModelConfig.from_dict(load("text-only.json")))


def test_transformers_dialect_keeps_quantization():
    q = load("vl-mxfp8.json")["quantization_config"]
    assert ModelConfig.from_dict(transformers_dialect(q)).quant is QuantMethod.MXFP8


def test_dense_layer_entries_are_not_read():
    raw = load("vl-bf16.json")
    assert raw["text_config"]["sparse_attention_config"]["sparse_disable_index_value"][:3] == [0, 0, 0]
    raw["text_config"]["sparse_attention_config"]["sparse_disable_index_value"][:3] = ["x", None, 7]
    ModelConfig.from_dict(raw)  # layers 0-2 are dense: their entries mean nothing


@pytest.mark.parametrize("value, message", [
    ([0, 0, 0] + [1] * 4 + [0] + [1] * 52, "sparse layer 7"),
    ([1] * 56 + [0], "sparse layer 59"),  # one entry per sparse layer
    ([1] * 10, "10 entries"),
])
def test_index_v_branch_is_refused_naming_the_layer(value, message):
    raw = load("vl-bf16.json")
    raw["text_config"]["sparse_attention_config"]["sparse_disable_index_value"] = value
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(raw)


def test_unsupported_score_type_names_the_layer():
    raw = load("text-only.json")
    raw["sparse_attention_config"]["sparse_score_type"] = ["max"] * 59 + ["mean"]
    with pytest.raises(ConfigError, match="'mean' at layer 59"):
        ModelConfig.from_dict(raw)


def test_unknown_extra_keys_are_accepted():
    raw = load("vl-mxfp8.json")
    raw.update(some_future_key={"a": 1}, num_mtp_modules=3)
    raw["text_config"].update(mtp_transformer_layers=1, another_new_field=[1, 2])
    raw["quantization_config"]["something_new"] = True
    assert shape(ModelConfig.from_dict(raw)) == shape(ModelConfig.from_dict(load("text-only.json")))


def test_mxfp8_block_other_than_32_is_refused():
    raw = load("vl-mxfp8.json")
    raw["quantization_config"]["weight_block_size"] = [128, 128]
    with pytest.raises(ConfigError, match="weight_block_size"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("key, value, message", [
    ("eos_token_id", "x", "eos_token_id must be an integer"),
    ("eos_token_id", [200020, "y"], "eos_token_id must be an integer"),
    ("hidden_size", "big", "hidden_size must be an integer"),
    ("hidden_size", "256", "hidden_size must be an integer, got '256' \\(a string\\)"),
    ("num_hidden_layers", 4.5, "num_hidden_layers must be an integer"),
    ("num_hidden_layers", True, "num_hidden_layers must be an integer"),
    ("vocab_size", 1e12, "vocab_size must be an integer"),
    ("vocab_size", 10 ** 12, "vocab_size=1000000000000 is outside"),
    ("rope_theta", "5e6", "rope_theta must be a number"),
    ("use_gemma_norm", "yes", "use_gemma_norm must be true or false"),
    ("num_local_experts", -1, "num_local_experts=-1 is outside"),
    ("moe_layer_freq", [0, 0, "1"] + [1] * 57, "moe_layer_freq\\[2\\] must be true or false"),
])
def test_value_types_are_checked_not_coerced(key, value, message):
    raw = copy.deepcopy(load("text-only.json"))
    raw[key] = value
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(raw)
