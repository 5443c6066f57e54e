"""Tiny MiniMax-M3 checkpoints: real HF layouts, deterministic, loadable by transformers' own M3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from m3bench.runtime.checkpoint import CheckpointReader
from m3bench.runtime.config import AttnKind, MlpKind, ModelConfig
from m3bench.runtime.tiny import Layout, TinySpec, random_weights, write_tiny_checkpoint


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[Layout, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {lay: write_tiny_checkpoint(root / lay.value, seed=1, layout=lay) for lay in Layout}


def test_config_of_every_layout_parses_to_the_same_model(written):
    cfgs = {lay: ModelConfig.from_pretrained(p) for lay, p in written.items()}
    spec = TinySpec()
    for lay, cfg in cfgs.items():
        assert cfg.attn_kinds == (AttnKind.DENSE,) + (AttnKind.MSA,) * 3, lay
        assert cfg.mlp_kinds == (MlpKind.DENSE,) + (MlpKind.MOE,) * 3, lay
        assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == (256, 8, 2, 32, 16)
        assert (cfg.msa.block_size, cfg.msa.topk_blocks, cfg.msa.index_dim) == (128, 2, 32), lay
        assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.shared_intermediate_size) == (8, 2, 128), lay
        assert cfg.vocab_size == spec.vocab_size and cfg.activation.value == "swigluoai", lay
        assert cfg.vl_wrapper == (lay in (Layout.VL, Layout.V5_VL)), lay
    assert len({(c.msa, c.moe, c.eos_token_ids, c.bos_token_id, c.rope_theta) for c in cfgs.values()}) == 1


def test_real_hf_config_fields(written):
    m3 = json.loads((written[Layout.M3] / "config.json").read_text())
    assert m3["architectures"] == ["MiniMaxM3SparseForCausalLM"]
    assert m3["moe_layer_freq"] == [0, 1, 1, 1] and m3["sparse_attention_config"]["sparse_block_size"] == 128
    vl = json.loads((written[Layout.VL] / "config.json").read_text())
    assert vl["model_type"] == "minimax_m3_vl" and "sparse_attention_config" in vl["text_config"]
    v5 = json.loads((written[Layout.V5] / "config.json").read_text())
    assert v5["model_type"] == "minimax_m3_vl_text" and v5["index_topk_blocks"] == 2
    assert v5["layer_types"][1] == "minimax_m3_sparse" and v5["mlp_layer_types"] == ["dense"] + ["sparse"] * 3


def test_weights_are_bf16_non_trivial_and_seeded(written, tmp_path):
    stored = load_file(str(written[Layout.M3] / "model.safetensors"))
    for k, v in stored.items():
        assert torch.isfinite(v.float()).all() and v.float().std() > 0.01, k
        want = torch.float32 if ".block_sparse_moe.gate." in k or "e_score" in k else torch.bfloat16
        assert v.dtype == want, k
    norm = stored["model.layers.1.self_attn.q_norm.weight"].float()
    assert 0.05 < norm.std() < 0.5  # Gemma scale 1 + w stays near 1 but is not the identity
    again = write_tiny_checkpoint(tmp_path / "again", seed=1)
    assert (again / "model.safetensors").read_bytes() == (written[Layout.M3] / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_text() == (written[Layout.M3] / "tokenizer.json").read_text()
    other = load_file(str(write_tiny_checkpoint(tmp_path / "other", seed=2) / "model.safetensors"))
    assert not torch.equal(other["model.embed_tokens.weight"], stored["model.embed_tokens.weight"])


def test_sharded_index_covers_every_tensor(tmp_path):
    p = write_tiny_checkpoint(tmp_path / "s", seed=0, layout=Layout.V5, shards=3)
    index = json.loads((p / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    stored = {k: f for f in files for k in load_file(str(p / f))}
    assert stored == index["weight_map"]
    assert index["metadata"]["total_size"] == sum((p / f).stat().st_size for f in files) - sum(
        8 + int.from_bytes((p / f).read_bytes()[:8], "little") for f in files)


def test_reader_sees_the_generated_weights(written):
    cfg = ModelConfig.from_pretrained(written[Layout.V5])
    want = random_weights(cfg, 1)
    r = CheckpointReader(written[Layout.V5], cfg)
    assert torch.equal(r.get("layers.3.moe.experts.6.up_proj.weight", torch.bfloat16),
                       want["layers.3.moe.experts.6.up_proj.weight"])


def test_transformers_loads_every_layout_to_identical_logits(written):
    """transformers' MiniMax-M3 (an independent implementation) reads the v5 files directly and the
    M3 / VL files through its own conversion mapping: the same model in every layout."""
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 2000, (1, 300), generator=torch.Generator().manual_seed(0))  # 3 blocks > top-2
    logits = {}
    for lay in (Layout.V5, Layout.VL, Layout.V5_VL):
        auto = transformers.AutoModelForCausalLM if lay is Layout.V5 else transformers.AutoModelForImageTextToText
        model = auto.from_pretrained(str(written[lay]), dtype=torch.float32).eval()
        with torch.no_grad():
            logits[lay] = model(input_ids=ids).logits[0]
    assert torch.isfinite(logits[Layout.V5]).all() and logits[Layout.V5].std() > 1.0
    assert torch.equal(logits[Layout.V5], logits[Layout.VL])
    assert torch.equal(logits[Layout.V5], logits[Layout.V5_VL])


def test_runtime_model_loads_every_layout_like_transformers(written, tmp_path):
    """CheckpointReader -> M3ForCausalLM.load_weights gives transformers' logits from every layout,
    sharded files included, on a prompt long enough for MSA to drop blocks (fp32)."""
    transformers = pytest.importorskip("transformers")
    from m3bench.runtime.contiguous import prefill_logits
    from m3bench.runtime.model import M3ForCausalLM

    ids = torch.randint(0, 2000, (300,), generator=torch.Generator().manual_seed(5))
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(written[Layout.V5]), dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(input_ids=ids[None]).logits[0]
    paths = {**{lay.value: p for lay, p in written.items()},
             "m3-sharded": write_tiny_checkpoint(tmp_path / "sharded", seed=1, shards=3)}
    for name, path in paths.items():
        cfg = ModelConfig.from_pretrained(path)
        model = M3ForCausalLM(cfg, dtype=torch.float32)
        model.load_weights(CheckpointReader(path, cfg))
        got = prefill_logits(model, ids.tolist(), tokens_per_block=cfg.msa.block_size)
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, (name, err)
