"""The fast model against transformers' independent implementations, in float64 on CPU (softmax and
the M3 router run in fp32 there, so agreement is ~1e-6 relative, not 1e-12).

MiniMax-M3 (`MiniMaxM3VLForCausalLM`, eager attention, MSA selection active) and the dense families
(Llama with llama3 rope scaling, Qwen2 with qkv bias and tied embeddings, Qwen3 with q/k norm).
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.contiguous import prefill_logits
from m3bench.runtime.model import M3ForCausalLM
from tiny_m3 import build, rel_err

transformers = pytest.importorskip("transformers")

M3_RENAMES = [
    (r"^model\.embed_tokens\.", "embed_tokens."), (r"^model\.norm\.", "norm."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.input_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.post_attn_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.indexer\.(q|k)_(proj|norm)\.", r"layers.\1.attn.index_\2_\3."),
    (r"^model\.layers\.(\d+)\.self_attn\.", r"layers.\1.attn."),
    (r"^model\.layers\.(\d+)\.mlp\.gate\.weight$", r"layers.\1.moe.router.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$", r"layers.\1.moe.router.bias"),
    (r"^model\.layers\.(\d+)\.mlp\.shared_experts\.", r"layers.\1.moe.shared."),
    (r"^model\.layers\.(\d+)\.mlp\.experts\.", r"layers.\1.moe.experts."),
    (r"^model\.layers\.(\d+)\.mlp\.", r"layers.\1.mlp."),
]


def to_canonical(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers-v5 names -> canonical names (fused gate_up split, stacked experts unstacked)."""
    out = {}
    for name, t in state.items():
        for pat, rep in M3_RENAMES:
            name, n = re.subn(pat, rep, name)
            if n:
                break
        if name.endswith("experts.gate_up_proj"):
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = t[e]
        elif name.endswith("gate_up_proj.weight"):
            gate, up = t.chunk(2, dim=0)
            out[name.replace("gate_up_proj", "gate_proj")] = gate
            out[name.replace("gate_up_proj", "up_proj")] = up
        else:
            out[name] = t
    return out


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Non-zero random weights: norms (incl. Gemma zeros) around neutral, router bias random too."""
    g = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if "e_score_correction_bias" in n})
    for name, t in tensors.items():
        x = torch.randn(t.shape, generator=g, dtype=torch.float64)
        if "norm" in name:
            base = 0.0 if isinstance(model, transformers.MiniMaxM3VLForCausalLM) else 1.0
            t.copy_(base + 0.3 * x)
        elif t.dim() == 1:
            t.copy_(0.1 * x)
        else:
            t.copy_(1.5 * x / t.shape[-1] ** 0.5)


def compare(hf_model, ids: list[int], tied: bool = False, chunks=None, tokens_per_block: int = 16,
            ckpt_dir=None) -> float:
    """Relative logit error of our model loaded from hf_model (by name mapping, or via save_pretrained
    and CheckpointReader when ckpt_dir is given)."""
    hf_model.eval()
    if ckpt_dir is None:
        cfg = ModelConfig.from_dict(hf_model.config.to_dict())
        weights = to_canonical(hf_model.state_dict())
        if tied:
            weights.pop("lm_head.weight", None)
        ours = build(cfg, weights, torch.float64)
    else:
        ours = _through_reader(hf_model, ckpt_dir)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits[0]
    mine = prefill_logits(ours, ids, chunks, tokens_per_block)
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))
    return rel_err(mine, theirs)


def _through_reader(hf_model, ckpt_dir) -> M3ForCausalLM:
    from m3bench.runtime.checkpoint import CheckpointReader, expected_tensors

    hf_model.save_pretrained(ckpt_dir)
    cfg = ModelConfig.from_pretrained(ckpt_dir)
    reader = CheckpointReader(ckpt_dir, cfg)
    reader.validate()
    ours = M3ForCausalLM(cfg, torch.float64)
    # the reader's schema and the model's parameters agree name for name, shape for shape
    assert expected_tensors(cfg) == {s.name: tuple(s.target.shape) for s in ours.weight_slots()}
    ours.load_weights(reader)
    return ours


def m3_config(**over):
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, rotary_dim=8,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
              dense_intermediate_size=96, shared_intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
              routed_scaling_factor=2.0, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
              layer_types=["full_attention"] + ["minimax_m3_sparse"] * 3, index_n_heads=2, index_head_dim=16,
              index_block_size=16, index_topk_blocks=2, index_local_blocks=1, max_position_embeddings=4096,
              rms_norm_eps=1e-6)
    kw.update(over)
    c = transformers.MiniMaxM3VLTextConfig(**kw)
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"
    return c


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_m3_matches_transformers_with_sparse_selection():
    torch.manual_seed(0)
    hf = transformers.MiniMaxM3VLForCausalLM(m3_config()).double()
    randomize(hf, 1)
    ids = _ids(100, 512, 2)  # 7 blocks of 16 > top-2: selection active on every MSA layer
    assert compare(hf, ids) < 3e-6
    # chunked prefill through 8-token pages gives the same logits
    assert compare(hf, ids, chunks=[40, 1, 23, 36], tokens_per_block=8) < 3e-6


def test_m3_through_save_pretrained_and_checkpoint_reader(tmp_path):
    pytest.importorskip("m3bench.runtime.checkpoint")
    torch.manual_seed(0)
    hf = transformers.MiniMaxM3VLForCausalLM(m3_config()).double()
    randomize(hf, 1)
    assert compare(hf, _ids(100, 512, 2), ckpt_dir=tmp_path) < 3e-6


def test_m3_selection_matters_in_this_test():
    """Guard: with top-2 blocks the logits differ from a dense (top-16) run, so the test above bites."""
    torch.manual_seed(0)
    sparse = transformers.MiniMaxM3VLForCausalLM(m3_config()).double()
    randomize(sparse, 1)
    dense = transformers.MiniMaxM3VLForCausalLM(m3_config(index_topk_blocks=16)).double()
    dense.load_state_dict(sparse.state_dict())
    ids = torch.tensor([_ids(100, 512, 2)])
    with torch.no_grad():
        assert rel_err(sparse(ids).logits, dense(ids).logits) > 1e-2


def test_llama_with_llama3_rope_scaling():
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=64))
    cfg._attn_implementation = "eager"
    hf = transformers.LlamaForCausalLM(cfg).double()
    randomize(hf, 3)
    assert compare(hf, _ids(40, 300, 4)) < 3e-6


def test_qwen2_with_qkv_bias_and_tied_embeddings(tmp_path):
    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=256)
    cfg._attn_implementation = "eager"
    hf = transformers.Qwen2ForCausalLM(cfg).double()
    randomize(hf, 5)
    hf.tie_weights()
    assert compare(hf, _ids(40, 300, 6), tied=True) < 3e-6
    if importlib.util.find_spec("m3bench.runtime.checkpoint"):
        assert compare(hf, _ids(40, 300, 6), ckpt_dir=tmp_path) < 3e-6


def test_qwen3_with_qk_norm():
    cfg = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=256)
    cfg._attn_implementation = "eager"
    hf = transformers.Qwen3ForCausalLM(cfg).double()
    randomize(hf, 7)
    assert compare(hf, _ids(40, 300, 8)) < 3e-6
