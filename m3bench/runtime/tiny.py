"""Tiny random MiniMax-M3 checkpoints in the real Hugging Face layouts, for tests and CI.

    write_tiny_checkpoint(Path("ckpt"), seed=0, layout=Layout.V5, shards=2)

Every layout of one seed holds the same canonical tensors: M3 bf16 names (`MiniMaxM3SparseForCausalLM`),
the `minimax_m3_vl` wrapper (`language_model.` prefix, `text_config`), transformers-v5 names
(`minimax_m3_vl_text`: flat `index_*` keys, `layer_types`, stacked experts) and its VL export
(`model.language_model.`). The tokenizer is a real byte-level BPE with M3's special tokens and a
chat template in M3's format, loadable with `AutoTokenizer.from_pretrained(dest)`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from m3bench.runtime.checkpoint import INDEX_FILE, SINGLE_FILE, expected_tensors
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.tiny_quant import TinyQuant, quantization_config, quantize_file_tensors

BOS = "]~!b["
TURN_OPEN = "]~b]"
TURN_CLOSE = "[e~["  # also the stop token
THINK_OPEN = "<mm:think>"
THINK_CLOSE = "</mm:think>"
SPECIAL_TOKENS = (BOS, TURN_OPEN, TURN_CLOSE)
MARKER_TOKENS = (THINK_OPEN, THINK_CLOSE)  # added tokens that stay in decoded text

# M3's format: BOS, each turn `]~b]` role `\n` content `[e~[` `\n`; the assistant's role word is `ai`.
CHAT_TEMPLATE = r"""{%- set roles = {'system': 'system', 'user': 'user', 'assistant': 'ai', 'ai': 'ai', 'tool': 'tool'} -%}
{%- set mode = thinking_mode | default('adaptive') -%}
{%- if mode not in ['enabled', 'disabled', 'adaptive'] -%}
{{- raise_exception('thinking_mode must be enabled, disabled or adaptive, not ' ~ mode) -}}
{%- endif -%}
{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] not in roles -%}
{{- raise_exception('unknown role ' ~ message['role']) -}}
{%- endif -%}
{{- ']~b]' ~ roles[message['role']] ~ '\n' ~ message['content'] ~ '[e~[\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- ']~b]ai\n' -}}
{%- if mode == 'enabled' -%}{{- '<mm:think>\n' -}}
{%- elif mode == 'disabled' -%}{{- '<mm:think>\n</mm:think>\n' -}}
{%- endif -%}
{%- endif -%}"""


class Layout(Enum):
    M3 = "m3"  # text-only export: model.layers.L.block_sparse_moe.experts.E.w1 ...
    VL = "vl"  # shipped wrapper: language_model.model.layers..., text_config
    V5 = "v5"  # transformers v5: mlp.experts.gate_up_proj [E, 2I, H], self_attn.indexer.*
    V5_VL = "v5-vl"  # transformers v5 VL export: model.language_model.layers...


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model: 1 dense layer then MSA + MoE layers, MSA block 128 (the real one)."""

    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_dense_layers: int = 1
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    rotary_dim: int = 16
    dense_intermediate_size: int = 512
    num_experts: int = 8
    top_k: int = 2
    intermediate_size: int = 128
    shared_intermediate_size: int = 128
    index_dim: int = 32
    block_size: int = 128
    topk_blocks: int = 2
    max_position_embeddings: int = 4096
    rope_theta: float = 5e6


# --- config.json ---------------------------------------------------------------------------------

def m3_text_config(spec: TinySpec, bos_id: int, eos_id: int) -> dict:
    """config.json fields of an M3 text model in the original (bf16 release) spelling."""
    flags = [0] * spec.num_dense_layers + [1] * (spec.num_layers - spec.num_dense_layers)
    return {
        "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3",
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "rotary_dim": spec.rotary_dim,
        "partial_rotary_factor": spec.rotary_dim / spec.head_dim, "rope_theta": spec.rope_theta,
        "rms_norm_eps": 1e-6, "use_gemma_norm": True, "use_qk_norm": True, "qk_norm_type": "per_head",
        "hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "dense_intermediate_size": spec.dense_intermediate_size, "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.top_k, "intermediate_size": spec.intermediate_size, "n_shared_experts": 1,
        "shared_intermediate_size": spec.shared_intermediate_size, "scoring_func": "sigmoid",
        "use_routing_bias": True, "routed_scaling_factor": 2.0, "moe_layer_freq": flags,
        "sparse_attention_config": {
            "sparse_attention_freq": flags, "sparse_num_index_heads": spec.num_kv_heads,
            "sparse_index_dim": spec.index_dim, "sparse_block_size": spec.block_size,
            "sparse_topk_blocks": spec.topk_blocks, "sparse_score_type": "max", "sparse_init_block": 0,
            "sparse_local_block": 1, "sparse_disable_index_value": 1},
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": False,
        "num_mtp_modules": 0, "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "bfloat16",
    }


def v5_text_config(spec: TinySpec, bos_id: int, eos_id: int) -> dict:
    """config.json fields as transformers v5 writes them (`MiniMaxM3VLTextConfig`)."""
    n_dense = spec.num_dense_layers
    return {
        "architectures": ["MiniMaxM3VLForCausalLM"], "model_type": "minimax_m3_vl_text",
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "rotary_dim": spec.rotary_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta,
                            "partial_rotary_factor": spec.rotary_dim / spec.head_dim},
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "dense_intermediate_size": spec.dense_intermediate_size, "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.top_k, "intermediate_size": spec.intermediate_size,
        "shared_intermediate_size": spec.shared_intermediate_size, "routed_scaling_factor": 2.0,
        "layer_types": ["full_attention"] * n_dense + ["minimax_m3_sparse"] * (spec.num_layers - n_dense),
        "mlp_layer_types": ["dense"] * n_dense + ["sparse"] * (spec.num_layers - n_dense),
        "index_n_heads": spec.num_kv_heads, "index_head_dim": spec.index_dim,
        "index_block_size": spec.block_size, "index_topk_blocks": spec.topk_blocks, "index_local_blocks": 1,
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": False,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": "bfloat16",
    }


def vl_wrapper_config(text: dict) -> dict:
    """The `minimax_m3_vl` wrapper around a text config, with a tiny vision tower config."""
    return {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
        "text_config": {**text, "architectures": None},
        "vision_config": {"model_type": "minimax_m3_vl_vision", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 2},
        "projector_hidden_size": text["hidden_size"], "tie_word_embeddings": False,
        "bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
    }


def config_for(layout: Layout, spec: TinySpec, bos_id: int, eos_id: int) -> dict:
    if layout is Layout.M3:
        return m3_text_config(spec, bos_id, eos_id)
    if layout is Layout.VL:
        return vl_wrapper_config(m3_text_config(spec, bos_id, eos_id))
    if layout is Layout.V5:
        return v5_text_config(spec, bos_id, eos_id)
    return vl_wrapper_config(v5_text_config(spec, bos_id, eos_id))


# --- random weights ------------------------------------------------------------------------------

def random_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Canonical tensors with sensible scales: unit embeddings, 1/sqrt(fan_in) linears, Gemma norm
    weights around 0 (scale 1 + w), fp32 router and correction bias; bf16 except the router.
    Generated in `expected_tensors` order from one seeded generator: every layout gets the same values."""
    gen = torch.Generator().manual_seed(seed)
    return {name: _random_tensor(name, shape, gen) for name, shape in expected_tensors(cfg).items()}


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if ".moe.router." in name:
        return x * (0.05 if name.endswith("bias") else 1 / math.sqrt(shape[-1]))
    if name.endswith("norm.weight"):
        return (0.2 * x).to(torch.bfloat16)
    if name == "embed_tokens.weight":
        return x.to(torch.bfloat16)
    if name == "lm_head.weight":  # logits of std ~4: clear greedy margins, fewer near-ties in tests
        return (4 * x / math.sqrt(shape[-1])).to(torch.bfloat16)
    return (x / math.sqrt(shape[-1])).to(torch.bfloat16)


# --- canonical -> file names ---------------------------------------------------------------------

M3_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"layers\.(\d+)\.input_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"layers\.(\d+)\.post_attn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"layers\.(\d+)\.attn\.(.+)", r"model.layers.\1.self_attn.\2"),
    (r"layers\.(\d+)\.mlp\.(.+)", r"model.layers.\1.mlp.\2"),
    (r"layers\.(\d+)\.moe\.router\.weight", r"model.layers.\1.block_sparse_moe.gate.weight"),
    (r"layers\.(\d+)\.moe\.router\.bias", r"model.layers.\1.block_sparse_moe.e_score_correction_bias"),
    (r"layers\.(\d+)\.moe\.experts\.(\d+)\.gate_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w1.weight"),
    (r"layers\.(\d+)\.moe\.experts\.(\d+)\.up_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w3.weight"),
    (r"layers\.(\d+)\.moe\.experts\.(\d+)\.down_proj\.weight", r"model.layers.\1.block_sparse_moe.experts.\2.w2.weight"),
    (r"layers\.(\d+)\.moe\.shared\.(.+)", r"model.layers.\1.block_sparse_moe.shared_experts.\2"),
    (r"(embed_tokens|norm)\.weight", r"model.\1.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
))


def m3_name(canonical: str) -> str:
    """Canonical name -> the M3 bf16 release's name."""
    for pat, repl in M3_RENAMES:
        if pat.fullmatch(canonical):
            return pat.sub(repl, canonical)
    raise ValueError(f"no M3 name for {canonical}")


def m3_tensors(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {m3_name(k): v for k, v in w.items()}


def v5_tensors(w: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers-v5 names: indexer.*, fused gate_up, experts stacked per layer."""
    out = {}
    for k, v in w.items():
        if ".moe.experts." in k or k.endswith(("gate_proj.weight", "up_proj.weight")):
            continue  # fused / stacked below
        name = m3_name(k).replace(".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")
        name = re.sub(r"\.self_attn\.index_([qk])_", r".self_attn.indexer.\1_", name)
        out[name.replace(".block_sparse_moe.", ".mlp.")] = v
    for i in range(cfg.num_layers):
        out.update(_v5_fused(w, i, cfg))
    return out


def _v5_fused(w: dict[str, torch.Tensor], i: int, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    p, cat = f"layers.{i}.", lambda s: torch.cat([w[s + "gate_proj.weight"], w[s + "up_proj.weight"]])
    q = f"model.layers.{i}.mlp."
    if f"{p}mlp.gate_proj.weight" in w:
        return {q + "gate_up_proj.weight": cat(p + "mlp.")}
    experts = range(cfg.moe.num_experts)
    out = {q + "experts.gate_up_proj": torch.stack([cat(f"{p}moe.experts.{e}.") for e in experts]),
           q + "experts.down_proj": torch.stack([w[f"{p}moe.experts.{e}.down_proj.weight"] for e in experts])}
    if f"{p}moe.shared.gate_proj.weight" in w:
        out[q + "shared_experts.gate_up_proj.weight"] = cat(p + "moe.shared.")
    return out


def vl_extras(layout: Layout, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A few vision / MTP tensors, so that readers prove they skip them."""
    ln = torch.randn(32, generator=gen).to(torch.bfloat16)
    if layout is Layout.VL:
        return {"vision_tower.vision_model.pre_layrnorm.weight": ln, "mtp.0.norm.weight": ln.clone()}
    return {"model.vision_tower.pre_layrnorm.weight": ln}


def file_tensors(w: dict[str, torch.Tensor], cfg: ModelConfig, layout: Layout, seed: int) -> dict[str, torch.Tensor]:
    """Canonical tensors renamed (and fused / stacked) as `layout` stores them."""
    if layout in (Layout.M3, Layout.VL):
        named = m3_tensors(w)
    else:
        named = v5_tensors(w, cfg)
    if layout is Layout.VL:
        named = {"language_model." + k: v for k, v in named.items()}
    if layout is Layout.V5_VL:
        named = {re.sub(r"^model\.", "model.language_model.", k): v for k, v in named.items()}
    if layout in (Layout.VL, Layout.V5_VL):
        named.update(vl_extras(layout, torch.Generator().manual_seed(seed + 1)))
    return named


# --- tokenizer -----------------------------------------------------------------------------------

CORPUS_PROSE = """\
The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light.
A train leaves the station at nine o'clock and travels two hundred kilometres before it stops for water.
Mixture-of-experts models route every token to a few experts chosen by a learned gate; the rest stay idle.
Sparse attention keeps the most relevant blocks of keys and skips the others, which saves memory and time.
If Maria has twelve apples and gives three to each of her friends, how many friends can she feed?
The library opens at eight, closes at six, and on Sundays lends books only to members with a valid card.
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the leaves of plants.
In 1969 the first people walked on the Moon; the mission returned safely after eight days in space.
She wrote the function carefully, tested every branch, and only then pushed the change for review.
Prices rose by five percent last year, so a coat that cost forty dollars now costs forty-two dollars.
The river flows north through the valley, past the old mill, the church, and the bridge of red stone.
Good software is small pieces with good names; each file has one role and each function does one thing.
Question: What is the capital of France? Answer: Paris is the capital and the largest city of France.
Water boils at one hundred degrees Celsius at sea level, but at a lower temperature on a high mountain.
The committee met on Tuesday, discussed the budget for three hours, and agreed to meet again next week.
Tokens are pieces of words; a tokenizer splits text into tokens and maps each one to an integer id.
A triangle has three sides and three angles, and the angles of every triangle add up to 180 degrees.
He ran five kilometres on Monday, seven on Wednesday and ten on Saturday, twenty-two kilometres in all.
The museum shows paintings from the sixteenth century, sculptures, maps, coins and ancient pottery.
Always check the result: multiply the answer by the divisor and add the remainder to get the dividend.
Clouds form when warm moist air rises, cools and condenses into tiny droplets of water or ice crystals.
The recipe needs two cups of flour, one cup of sugar, three eggs, a pinch of salt and some butter.
Computers store numbers in binary; eight bits make a byte and a kilobyte holds one thousand bytes.
Economics studies how people choose to use scarce resources, and how markets set prices and wages.
The teacher asked the students to explain their reasoning step by step before giving a final answer.
"""


def training_corpus() -> list[str]:
    """Deterministic built-in text: prose, arithmetic (many distinct numbers) and small functions."""
    lines = CORPUS_PROSE.splitlines()
    for a in range(1, 400):
        b = a % 17 + 3
        lines.append(f"Step {a}: {a} * {b} = {a * b}, and {a * 7} - {a} = {a * 6}.")
    for n in range(40):
        lines.append(f"def f{n}(x, y={n}):\n    return [x + i * y for i in range({n % 7 + 2})]\n")
    return lines


def build_tokenizer(vocab_size: int):
    """Byte-level BPE trained on the built-in corpus; M3's specials take the last ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL_TOKENS) + len(MARKER_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size - n_added:
        raise ValueError(f"the built-in corpus yields {tok.get_vocab_size()} BPE tokens, fewer than "
                         f"vocab_size {vocab_size} - {n_added} specials")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return tok


def write_tokenizer(dest: Path, vocab_size: int) -> dict[str, int]:
    """Save tokenizer.json, tokenizer_config.json and the chat template; return the added tokens' ids."""
    from transformers import PreTrainedTokenizerFast

    tok = build_tokenizer(vocab_size)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=TURN_CLOSE,
                                 add_bos_token=False, clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(dest))
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + MARKER_TOKENS}


# --- writing -------------------------------------------------------------------------------------

def write_safetensors(tensors: dict[str, torch.Tensor], dest: Path, shards: int) -> None:
    """One model.safetensors, or `shards` files of about equal size plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    meta = {"format": "pt"}
    if shards <= 1:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / SINGLE_FILE), metadata=meta)
        return
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(shards)]
    done = 0
    for k, v in tensors.items():
        groups[min(shards - 1, done * shards // max(total, 1))][k] = v.contiguous()
        done += v.numel() * v.element_size()
    weight_map = {}
    for n, group in enumerate(groups, start=1):
        fname = f"model-{n:05d}-of-{shards:05d}.safetensors"
        save_file(group, str(dest / fname), metadata=meta)
        weight_map.update({k: fname for k in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / INDEX_FILE).write_text(json.dumps(index, indent=2))


def write_tiny_checkpoint(dest: Path | str, seed: int = 0, layout: Layout = Layout.M3, shards: int = 1,
                          spec: TinySpec = TinySpec(), weights: TinyQuant = TinyQuant.NONE) -> Path:
    """Write config.json, generation_config.json, safetensors and the tokenizer to `dest`; `weights`
    MXFP8 / NVFP4 stores the linear layers as the quantized releases do (runtime/tiny_quant.py)."""
    dest = Path(dest)
    if weights is not TinyQuant.NONE and layout not in (Layout.M3, Layout.VL):
        raise ValueError(f"quantized tiny checkpoints use the M3 / VL names, not layout {layout.value}")
    dest.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(dest, spec.vocab_size)
    raw = config_for(layout, spec, ids[BOS], ids[TURN_CLOSE])
    if weights is not TinyQuant.NONE:
        raw["quantization_config"] = quantization_config(weights)
    (dest / "config.json").write_text(json.dumps(raw, indent=2))
    gen_cfg = {"bos_token_id": ids[BOS], "eos_token_id": ids[TURN_CLOSE], "do_sample": True,
               "temperature": 1.0, "top_p": 0.95, "top_k": 40}
    (dest / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
    cfg = ModelConfig.from_dict(raw)
    named = quantize_file_tensors(file_tensors(random_weights(cfg, seed), cfg, layout, seed), weights)
    write_safetensors(named, dest, shards)
    return dest
