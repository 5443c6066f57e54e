"""CheckpointReader: every naming scheme to one canonical scheme, lazy shards, errors, dequant."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from m3bench.runtime import quant
from m3bench.runtime.checkpoint import CheckpointReader, Quant, Shard, expected_tensors
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.tiny import Layout, random_weights, write_tiny_checkpoint

SEED = 3


def _reader(path: Path) -> CheckpointReader:
    return CheckpointReader(path, ModelConfig.from_pretrained(path))


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    out = {lay.value: write_tiny_checkpoint(root / lay.value, seed=SEED, layout=lay) for lay in Layout}
    out["m3-sharded"] = write_tiny_checkpoint(root / "m3-sharded", seed=SEED, layout=Layout.M3, shards=3)
    out["v5-sharded"] = write_tiny_checkpoint(root / "v5-sharded", seed=SEED, layout=Layout.V5, shards=2)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(path: Path, edit) -> None:
    """Load model.safetensors, let `edit(dict)` change it, save it back."""
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_every_layout_gives_identical_canonical_tensors(layouts):
    cfg = ModelConfig.from_pretrained(layouts["m3"])
    want = random_weights(cfg, SEED)
    for name, path in layouts.items():
        r = _reader(path)
        r.validate()
        assert sorted(r.names()) == sorted(want), name
        assert r.unrecognised == [], name
        for k, v in want.items():
            got = r.get(k, v.dtype)
            assert got.dtype == v.dtype and torch.equal(got, v), (name, k)


def test_files_of_each_layout_use_their_own_names(layouts):
    def keys(p: Path) -> set[str]:
        r = _reader(p)
        return {s.data.key for s in r.sources.values()}

    assert "model.layers.1.block_sparse_moe.experts.0.w1.weight" in keys(layouts["m3"])
    assert "language_model.model.layers.1.self_attn.index_q_proj.weight" in keys(layouts["vl"])
    assert "language_model.lm_head.weight" in keys(layouts["vl"])
    v5 = keys(layouts["v5"])
    assert {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.self_attn.indexer.k_norm.weight",
            "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.0.mlp.gate_up_proj.weight"} <= v5
    assert "model.language_model.layers.2.mlp.experts.down_proj" in keys(layouts["v5-vl"])
    assert (layouts["m3-sharded"] / "model.safetensors.index.json").exists()


def test_vision_and_mtp_tensors_are_skipped(layouts):
    stored = load_file(str(layouts["vl"] / "model.safetensors"))
    assert "vision_tower.vision_model.pre_layrnorm.weight" in stored and "mtp.0.norm.weight" in stored
    r = _reader(layouts["vl"])
    assert not any("vision" in s.data.key or "mtp" in s.data.key for s in r.sources.values())


def test_expected_tensors_shapes(layouts):
    cfg = ModelConfig.from_pretrained(layouts["m3"])
    e = expected_tensors(cfg)
    assert e["layers.0.mlp.gate_proj.weight"] == (cfg.dense_intermediate_size, cfg.hidden_size)
    assert e["layers.1.attn.index_q_proj.weight"] == (cfg.msa.index_heads * cfg.msa.index_dim, cfg.hidden_size)
    assert e["layers.1.attn.index_k_proj.weight"] == (cfg.msa.index_dim, cfg.hidden_size)
    assert e["layers.3.moe.experts.7.down_proj.weight"] == (cfg.hidden_size, cfg.moe.intermediate_size)
    assert e["layers.2.moe.router.bias"] == (cfg.moe.num_experts,)
    assert "layers.0.attn.index_q_proj.weight" not in e and "layers.0.moe.router.weight" not in e
    assert len([k for k in e if ".moe.experts." in k]) == 3 * 8 * 3


@pytest.mark.parametrize("layout", ["m3", "v5"])
def test_shard_reads_only_its_slice(layouts, layout):
    full_reader = _reader(layouts[layout])
    for name, dim in [("layers.1.moe.experts.5.up_proj.weight", 0), ("layers.2.moe.experts.3.down_proj.weight", 1),
                      ("layers.0.mlp.up_proj.weight", 0), ("layers.3.moe.shared.gate_proj.weight", 1),
                      ("embed_tokens.weight", 1)]:
        full = full_reader.get(name, torch.bfloat16)
        parts = []
        for rank in range(4):
            r = _reader(layouts[layout])
            parts.append(r.get(name, torch.bfloat16, Shard(dim, rank, 4)))
            assert r.bytes_read == full.numel() * 2 // 4, (name, rank)
        assert torch.equal(torch.cat(parts, dim=dim), full), name


def test_bytes_read_counts_every_get(layouts):
    r = _reader(layouts["m3"])
    assert r.bytes_read == 0  # opening reads headers only
    r.get("norm.weight", torch.float32)
    r.get("layers.1.moe.router.weight", torch.float32)  # fp32 on disk
    cfg = r.cfg
    assert r.bytes_read == cfg.hidden_size * 2 + cfg.moe.num_experts * cfg.hidden_size * 4


def test_uneven_shard_is_refused(layouts):
    r = _reader(layouts["m3"])
    with pytest.raises(ValueError, match="does not split"):
        r.get("layers.0.attn.k_proj.weight", torch.float32, Shard(0, 0, 3))


def test_missing_tensor_is_named(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")
    _rewrite(p, lambda t: t.pop("model.layers.2.self_attn.index_k_norm.weight"))
    with pytest.raises(CheckpointError) as e:
        _reader(p).validate()
    msg = str(e.value)
    assert "1 missing: layers.2.attn.index_k_norm.weight" in msg and "\n" not in msg


def test_many_missing_tensors_are_listed_with_a_count(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")
    _rewrite(p, lambda t: [t.pop(k) for k in list(t) if ".experts." in k])
    with pytest.raises(CheckpointError, match=r"72 missing: .*\(72 in all\)"):
        _reader(p).validate()


def test_wrong_shape_is_named(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")

    def shrink(t):
        t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"][:-1].clone()

    _rewrite(p, shrink)
    with pytest.raises(CheckpointError, match=r"mis-shaped: layers\.0\.attn\.q_proj\.weight \(255, 256\) "
                                              r"\(expected \(256, 256\)\)"):
        _reader(p).validate()


def test_unknown_tensor_is_named(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")
    _rewrite(p, lambda t: t.update({"model.layers.0.self_attn.rel_bias": torch.ones(4)}))
    with pytest.raises(CheckpointError, match=r"1 unexpected: model\.layers\.0\.self_attn\.rel_bias"):
        _reader(p).validate()


def test_tensor_for_a_layer_that_does_not_exist_is_unexpected(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")
    _rewrite(p, lambda t: t.update({"model.layers.9.input_layernorm.weight": torch.ones(256)}))
    with pytest.raises(CheckpointError, match=r"unexpected: layers\.9\.input_norm\.weight"):
        _reader(p).validate()


def test_corrupt_safetensors_is_one_line(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "c")
    f = p / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])  # truncated: header claims more data than the file holds
    with pytest.raises(CheckpointError) as e:
        _reader(p)
    assert "cannot read" in str(e.value) and "\n" not in str(e.value)
    f.write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        _reader(p)


def test_index_naming_a_missing_file(layouts, tmp_path):
    p = _copy(layouts["m3-sharded"], tmp_path / "c")
    (p / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00003.safetensors is missing"):
        _reader(p)


def test_broken_index_and_no_weights(layouts, tmp_path):
    p = _copy(layouts["m3-sharded"], tmp_path / "c")
    (p / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid safetensors index"):
        _reader(p)
    q = tmp_path / "empty"
    q.mkdir()
    shutil.copy(layouts["m3"] / "config.json", q / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        _reader(q)


def test_duplicate_canonical_tensor_is_refused(layouts, tmp_path):
    p = _copy(layouts["vl"], tmp_path / "c")
    _rewrite(p, lambda t: t.update({"model.norm.weight": t["language_model.model.norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match="norm.weight is stored twice"):
        _reader(p)


# --- quantized checkpoints -----------------------------------------------------------------------

def _quantize_checkpoint(p: Path) -> dict[str, tuple]:
    """Turn the tiny M3 checkpoint into a ModelOpt-style one: experts NVFP4, attention MXFP8
    (scale `weight_scale_inv`), shared experts MXFP8 (scale `weight_scale`). Returns what was stored."""
    stored = {}

    def edit(t):
        for k in [k for k in t if k.endswith("_proj.weight") or ".experts." in k]:
            w = t.pop(k)
            base = k[: -len("weight")]
            if ".experts." in k and ".shared_experts." not in k:
                packed, s, s2 = quant.quant_nvfp4(w)
                t.update({k: packed, base + "weight_scale": s, base + "weight_scale_2": s2,
                          base + "input_scale": torch.tensor(1.0)})
                stored[k] = (Quant.NVFP4, packed, s, s2, w)
            elif k.startswith("model.layers.") and (".self_attn." in k or ".shared_experts." in k):
                q, s = quant.quant_mxfp8(w)
                scale_name = "weight_scale" if ".shared_experts." in k else "weight_scale_inv"
                t.update({k: q, base + scale_name: s})
                stored[k] = (Quant.MXFP8, q, s, None, w)
            else:
                t[k] = w

    _rewrite(p, edit)
    return stored


def test_quantized_checkpoint_dequantizes_on_load(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "q")
    stored = _quantize_checkpoint(p)
    r = _reader(p)
    r.validate()  # shapes are the dequantized ones
    assert r.quant_of("layers.1.moe.experts.2.up_proj.weight") is Quant.NVFP4
    assert r.quant_of("layers.1.moe.shared.down_proj.weight") is Quant.MXFP8
    assert r.quant_of("layers.0.attn.q_proj.weight") is Quant.MXFP8
    assert r.quant_of("layers.1.moe.router.weight") is Quant.NONE
    checked = 0
    for key, (kind, data, s, s2, orig) in stored.items():
        name = _canonical(r, key)
        got = r.get(name, torch.float32)
        ref = quant.dequant_nvfp4(data, s, s2, torch.float32) if kind is Quant.NVFP4 \
            else quant.dequant_mxfp8(data, s, torch.float32)
        assert torch.equal(got, ref), name
        tol = 0.6 if kind is Quant.NVFP4 else 0.07  # relative to the tensor's max
        assert (got - orig.float()).abs().max() <= tol * orig.float().abs().max(), name
        checked += 1
    assert checked > 80


def _canonical(r: CheckpointReader, key: str) -> str:
    return next(n for n, s in r.sources.items() if s.data.key == key)


@pytest.mark.parametrize("name", ["layers.2.moe.experts.4.gate_proj.weight", "layers.2.moe.experts.4.down_proj.weight",
                                  "layers.1.attn.o_proj.weight", "layers.1.moe.shared.up_proj.weight"])
@pytest.mark.parametrize("dim", [0, 1])
def test_quantized_shards(layouts, tmp_path_factory, name, dim):
    p = tmp_path_factory.mktemp("qs") / "q"
    _copy(layouts["m3"], p)
    _quantize_checkpoint(p)
    full = _reader(p).get(name, torch.float32)
    parts = [_reader(p).get(name, torch.float32, Shard(dim, rank, 2)) for rank in range(2)]
    assert torch.equal(torch.cat(parts, dim), full)


def test_quantized_shard_not_aligned_to_scale_blocks(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "q")
    _quantize_checkpoint(p)
    # down_proj of an expert has 128 inputs: 16 shards of 8 columns cut 16-element NVFP4 blocks
    with pytest.raises(CheckpointError, match="do not align"):
        _reader(p).get("layers.1.moe.experts.0.down_proj.weight", torch.float32, Shard(1, 1, 16))


def test_fp8_weight_without_scale_is_refused(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "q")
    key = "model.layers.0.self_attn.q_proj.weight"
    _rewrite(p, lambda t: t.update({key: t[key].to(torch.float8_e4m3fn)}))
    with pytest.raises(CheckpointError, match="no weight_scale"):
        _reader(p)


def test_quant_scale_of_wrong_shape_is_mis_shaped(layouts, tmp_path):
    p = _copy(layouts["m3"], tmp_path / "q")
    _quantize_checkpoint(p)
    key = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    _rewrite(p, lambda t: t.update({key: t[key][:, :-1].clone()}))
    with pytest.raises(CheckpointError, match=r"mis-shaped: layers\.0\.attn\.q_proj\.weight scale \(256, 7\)"):
        _reader(p).validate()


# --- dense families, as transformers saves them ---------------------------------------------------

DENSE = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=True),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True, head_dim=16),
}
DENSE_RENAMES = [("model.", ""), ("self_attn.", "attn."), ("input_layernorm", "input_norm"),
                 ("post_attention_layernorm", "post_attn_norm")]


@pytest.mark.parametrize("family", list(DENSE))
def test_dense_family_checkpoints_saved_by_transformers(tmp_path, family):
    transformers = pytest.importorskip("transformers")
    raw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, **DENSE[family])
    hf_cfg = transformers.AutoConfig.for_model(**raw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).to(torch.bfloat16)
    model.save_pretrained(str(tmp_path))
    r = _reader(tmp_path)
    r.validate()
    state = {k: v for k, v in model.state_dict().items() if not (r.cfg.tie_word_embeddings and k == "lm_head.weight")}
    assert len(state) == len(r.names())
    for k, v in state.items():
        name = k
        for a, b in DENSE_RENAMES:
            name = name.replace(a, b, 1) if a == "model." else name.replace(a, b)
        assert torch.equal(r.get(name, torch.bfloat16), v), k
    if family == "qwen2":
        assert "layers.1.attn.v_proj.bias" in r.names()
    if family == "qwen3":
        assert "layers.0.attn.k_norm.weight" in r.names()


def test_tied_checkpoint_may_keep_its_lm_head_copy(tmp_path):
    transformers = pytest.importorskip("transformers")
    raw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, **DENSE["llama"])
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**raw))
    model.save_pretrained(str(tmp_path))
    _rewrite(tmp_path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    _reader(tmp_path).validate()
