"""ModelConfig: a frozen, strictly parsed view of a Hugging Face config.json.

MiniMax-M3 (`MiniMaxM3SparseForCausalLM`, the `minimax_m3_vl` wrapper with `text_config`,
transformers-v5 `minimax_m3_vl_text` with flat `index_*` keys) and the dense families
(Llama, Qwen2, Qwen3) as the degenerate case: every layer dense attention + dense MLP.

    cfg = ModelConfig.from_pretrained(Path("ckpt"))   # or ModelConfig.from_dict(json_dict)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from m3bench.runtime.config_values import (
    REQUIRED, check_bool, check_int, per_layer_values, read_bool, read_float, read_int, read_optional_token_id,
    read_str, read_token_ids,
)
from m3bench.runtime.errors import ConfigError


class Family(Enum):
    MINIMAX_M3 = "minimax_m3"
    LLAMA = "llama"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"


class AttnKind(Enum):
    DENSE = "dense"
    MSA = "msa"


class MlpKind(Enum):
    DENSE = "dense"
    MOE = "moe"


class Activation(Enum):
    SWIGLUOAI = "swigluoai"  # g = gate.clamp(max=L); u = up.clamp(-L, L); g * sigmoid(alpha g) * (u + 1)
    SILU = "silu"  # silu(gate) * up


class NormKind(Enum):
    GEMMA = "gemma"  # x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32
    PLAIN = "plain"  # x * rsqrt(mean(x^2) + eps) * w, in fp32


class QuantMethod(Enum):
    NONE = "none"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"  # ModelOpt MIXED_PRECISION: experts NVFP4, attention / shared experts MXFP8


@dataclass(frozen=True)
class MsaConfig:
    """MSA (MiniMax sparse attention) settings shared by every sparse layer."""

    index_heads: int
    index_dim: int
    block_size: int
    topk_blocks: int
    init_blocks: int
    local_blocks: int


@dataclass(frozen=True)
class MoeConfig:
    """Routed experts (sigmoid router with correction bias) plus ungated shared experts."""

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_intermediate_size: int  # 0: no shared expert
    routed_scaling_factor: float
    use_routing_bias: bool


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (the only rope_scaling the dense families need)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    family: Family
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    rms_norm_eps: float
    norm: NormKind
    qk_norm: bool  # per-head RMSNorm of q and k (one weight of head_dim shared by all heads)
    qkv_bias: bool
    activation: Activation
    swiglu_alpha: float
    swiglu_limit: float
    dense_intermediate_size: int
    attn_kinds: tuple[AttnKind, ...]
    mlp_kinds: tuple[MlpKind, ...]
    msa: MsaConfig | None
    moe: MoeConfig | None
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    quant: QuantMethod
    vl_wrapper: bool  # tensors live under `language_model.` (and vision towers are skipped)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.attn_kinds) if k is AttnKind.MSA)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.mlp_kinds) if k is MlpKind.MOE)

    @classmethod
    def from_pretrained(cls, path: Path | str) -> "ModelConfig":
        """Parse `path/config.json` (or a config.json path itself)."""
        return cls.from_dict(read_config_json(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ConfigError("config.json must hold a JSON object")
        model_type = raw.get("model_type")
        if model_type == "minimax_m3_vl":
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError("minimax_m3_vl config has no text_config object")
            merged = {**{k: raw[k] for k in WRAPPER_FALLBACK_KEYS if k in raw}, **text}
            merged["quantization_config"] = raw.get("quantization_config", text.get("quantization_config"))
            return _parse_m3(merged, vl_wrapper=True, architecture=_arch(raw))
        if model_type in M3_TEXT_TYPES:
            return _parse_m3(raw, vl_wrapper=False, architecture=_arch(raw))
        if model_type in DENSE_TYPES:
            return _parse_dense(raw, DENSE_TYPES[model_type])
        known = sorted(["minimax_m3_vl", *M3_TEXT_TYPES, *DENSE_TYPES])
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(known)}")


def read_config_json(path: Path | str, what: str = "config.json") -> Any:
    """The JSON of `path/config.json` (or of a config.json path itself); a clear ConfigError otherwise."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    if not p.exists():
        raise ConfigError(f"no {what} at {p}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON: {e.msg} (line {e.lineno})") from None
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror}") from None


# Keys a VL wrapper may hold at its top level instead of in text_config.
WRAPPER_FALLBACK_KEYS = ("bos_token_id", "eos_token_id", "tie_word_embeddings")
M3_TEXT_TYPES = ("minimax_m3", "minimax_m3_sparse", "minimax_m3_vl_text", "minimax_m3_text")
DENSE_TYPES = {"llama": Family.LLAMA, "qwen2": Family.QWEN2, "qwen3": Family.QWEN3}
SPARSE_LAYER_NAMES = ("sparse_attention", "minimax_m3_sparse", "sparse")
DENSE_LAYER_NAMES = ("full_attention", "dense", "attention")


def _arch(raw: dict) -> str:
    archs = raw.get("architectures") or ["?"]
    return str(archs[0]) if isinstance(archs, list) else str(archs)


def _rope_params(raw: dict, head_dim: int) -> tuple[float, int, RopeScaling | None]:
    """(theta, rotary_dim, scaling) from legacy keys or transformers-v5 `rope_parameters`."""
    rp = raw.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ConfigError(f"config.json: rope_parameters must be an object, got {rp!r}")
    theta = read_float(raw, "rope_theta", default=read_float(rp, "rope_theta", default=10000.0))
    factor = raw.get("partial_rotary_factor", rp.get("partial_rotary_factor"))
    if raw.get("rotary_dim") is not None:
        rotary_dim = read_int(raw, "rotary_dim")
    elif factor is not None:
        rotary_dim = int(head_dim * read_float({"partial_rotary_factor": factor}, "partial_rotary_factor"))
    else:
        rotary_dim = head_dim
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ConfigError(f"rotary_dim {rotary_dim} must be even and in (0, head_dim={head_dim}]")
    scaling = raw.get("rope_scaling") or (rp if rp.get("rope_type") not in (None, "default") else None)
    return theta, rotary_dim, _rope_scaling(scaling)


def _rope_scaling(s: dict | None) -> RopeScaling | None:
    if not s:
        return None
    if not isinstance(s, dict):
        raise ConfigError(f"config.json: rope_scaling must be an object, got {s!r}")
    kind = s.get("rope_type", s.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(f"unsupported rope scaling type {kind!r} (supported: llama3)")
    return RopeScaling(
        factor=read_float(s, "factor"),
        low_freq_factor=read_float(s, "low_freq_factor"),
        high_freq_factor=read_float(s, "high_freq_factor"),
        original_max_position_embeddings=read_int(s, "original_max_position_embeddings", lo=1),
    )


def _quant(raw: dict) -> QuantMethod:
    q = raw.get("quantization_config")
    if not q:
        return QuantMethod.NONE
    if not isinstance(q, dict):
        raise ConfigError(f"config.json: quantization_config must be an object, got {q!r}")
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "")).upper()
    if method == "mxfp8":
        _check_mx_block(q)
        return QuantMethod.MXFP8
    if method == "modelopt" or algo in ("NVFP4", "MIXED_PRECISION"):
        return QuantMethod.NVFP4
    raise ConfigError(f"unsupported quantization_config (quant_method={method!r}, quant_algo={algo!r})")


def _check_mx_block(q: dict) -> None:
    block = q.get("weight_block_size", [1, 32])
    if block != [1, 32]:
        raise ConfigError(f"quantization_config.weight_block_size {block!r} is not supported (MXFP8 needs [1, 32])")


def _act(name: Any) -> Activation:
    name = str(name).lower()
    if name == "swigluoai":
        return Activation.SWIGLUOAI
    if name in ("silu", "swish"):
        return Activation.SILU
    raise ConfigError(f"unsupported hidden_act {name!r} (supported: swigluoai, silu)")


def _flag_list(key: str, f: Any, n: int) -> list[bool]:
    """A 0/1 list, or an int period p (every p-th layer on)."""
    if isinstance(f, list):
        return [check_bool(f"{key}[{i}]", x) for i, x in enumerate(f)]
    period = check_int(key, f)
    return [bool(period) and (i + 1) % period == 0 for i in range(n)]


def _per_layer(raw: dict, n: int, freq_key: str, types_key: str, sparse_names: tuple, dense_names: tuple,
               source: dict | None = None) -> tuple[bool, ...]:
    """Per-layer on/off from a 0/1 frequency list (or an int period), or a list of type names."""
    src = raw if source is None or source.get(freq_key) is None else source
    if src.get(freq_key) is not None:
        flags = _flag_list(freq_key, src[freq_key], n)
    elif raw.get(types_key) is not None:
        if not isinstance(raw[types_key], list):
            raise ConfigError(f"config.json: {types_key} must be a list, got {raw[types_key]!r}")
        flags = []
        for i, t in enumerate(raw[types_key]):
            if t not in sparse_names + dense_names:
                raise ConfigError(f"unknown entry {t!r} in {types_key} (layer {i})")
            flags.append(t in sparse_names)
    else:
        raise ConfigError(f"config.json lacks {freq_key} (or {types_key})")
    if len(flags) != n:
        raise ConfigError(f"{freq_key or types_key} has {len(flags)} entries for {n} layers")
    return tuple(flags)


def _attn_shape(raw: dict) -> tuple[int, int, int, int, int]:
    """(hidden, layers, heads, kv_heads, head_dim), each a checked integer."""
    hidden = read_int(raw, "hidden_size", lo=1)
    n_layers = read_int(raw, "num_hidden_layers", lo=1)
    heads = read_int(raw, "num_attention_heads", lo=1)
    kv_heads = read_int(raw, "num_key_value_heads", default=heads, lo=1)
    head_dim = read_int(raw, "head_dim", default=hidden // heads, lo=1)
    return hidden, n_layers, heads, kv_heads, head_dim


def _parse_m3(raw: dict, vl_wrapper: bool, architecture: str) -> ModelConfig:
    hidden, n_layers, heads, kv_heads, head_dim = _attn_shape(raw)
    theta, rotary_dim, scaling = _rope_params(raw, head_dim)
    sparse_cfg = raw.get("sparse_attention_config") or {}
    if not isinstance(sparse_cfg, dict):
        raise ConfigError(f"config.json: sparse_attention_config must be an object, got {sparse_cfg!r}")
    sparse = _per_layer(raw, n_layers, "sparse_attention_freq", "layer_types", SPARSE_LAYER_NAMES,
                        DENSE_LAYER_NAMES, source=sparse_cfg)
    moe = _per_layer(raw, n_layers, "moe_layer_freq", "mlp_layer_types", ("sparse", "moe"), ("dense",))
    sparse_layers = tuple(i for i, s in enumerate(sparse) if s)
    _check_m3_options(raw, sparse_cfg, n_layers, sparse_layers)
    cfg = ModelConfig(
        family=Family.MINIMAX_M3, architecture=architecture,
        vocab_size=read_int(raw, "vocab_size", lo=1), hidden_size=hidden, num_layers=n_layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim,
        rope_theta=theta, rope_scaling=scaling, rms_norm_eps=read_float(raw, "rms_norm_eps", default=1e-6),
        norm=NormKind.GEMMA if read_bool(raw, "use_gemma_norm", True) else NormKind.PLAIN,
        qk_norm=read_bool(raw, "use_qk_norm", True), qkv_bias=False,
        activation=Activation.SWIGLUOAI if raw.get("model_type") == "minimax_m3_vl_text"
        else _act(read_str(raw, "hidden_act", "swigluoai")),
        swiglu_alpha=read_float(raw, "swiglu_alpha", default=1.702),
        swiglu_limit=read_float(raw, "swiglu_limit", default=7.0),
        dense_intermediate_size=read_int(raw, "dense_intermediate_size", default=0),
        attn_kinds=tuple(AttnKind.MSA if s else AttnKind.DENSE for s in sparse),
        mlp_kinds=tuple(MlpKind.MOE if m else MlpKind.DENSE for m in moe),
        msa=_parse_msa(raw, sparse_cfg, kv_heads) if sparse_layers else None,
        moe=_parse_moe(raw) if any(moe) else None, tie_word_embeddings=read_bool(raw, "tie_word_embeddings", False),
        max_position_embeddings=read_int(raw, "max_position_embeddings", lo=1),
        bos_token_id=read_optional_token_id(raw, "bos_token_id"), eos_token_ids=read_token_ids(raw, "eos_token_id"),
        quant=_quant(raw), vl_wrapper=vl_wrapper,
    )
    _validate(cfg)
    return cfg


def _check_m3_options(raw: dict, sparse_cfg: dict, n_layers: int, sparse_layers: tuple[int, ...]) -> None:
    qk_type = raw.get("qk_norm_type") or "per_head"
    if read_bool(raw, "use_qk_norm", True) and qk_type != "per_head":
        raise ConfigError(f"unsupported qk_norm_type {qk_type!r} (supported: per_head)")
    _check_sparse_options(raw, sparse_cfg, n_layers, sparse_layers)
    scoring = raw.get("scoring_func") or "sigmoid"
    if scoring != "sigmoid":
        raise ConfigError(f"unsupported scoring_func {scoring!r} (supported: sigmoid)")


def _check_sparse_options(raw: dict, s: dict, n_layers: int, sparse_layers: tuple[int, ...]) -> None:
    """Per-layer MSA options, read at the sparse layers only (a dense layer's entry means nothing)."""
    key = "sparse_score_type"
    for layer, score in per_layer_values(s.get(key, raw.get(key, "max")), key, n_layers, sparse_layers).items():
        if score != "max":
            raise ConfigError(f"unsupported {key} {score!r} at layer {layer} (supported: max)")
    key = "sparse_disable_index_value"
    for layer, v in per_layer_values(s.get(key, raw.get(key, 1)), key, n_layers, sparse_layers).items():
        if not check_bool(f"{key} (layer {layer})", v):
            raise ConfigError(f"{key}=0 at sparse layer {layer} (an index-V branch) is not supported")


def _parse_msa(raw: dict, s: dict, kv_heads: int) -> MsaConfig:
    def pick(legacy: str, flat: str, default: Any = REQUIRED) -> int:
        if s.get(legacy) is not None:
            return read_int(s, legacy)
        return read_int(raw, flat, legacy, default=default)

    return MsaConfig(
        index_heads=pick("sparse_num_index_heads", "index_n_heads", kv_heads),
        index_dim=pick("sparse_index_dim", "index_head_dim"),
        block_size=pick("sparse_block_size", "index_block_size"),
        topk_blocks=pick("sparse_topk_blocks", "index_topk_blocks"),
        init_blocks=pick("sparse_init_block", "index_init_blocks", 0),
        local_blocks=pick("sparse_local_block", "index_local_blocks", 1),
    )


def _parse_moe(raw: dict) -> MoeConfig:
    n_shared = read_int(raw, "n_shared_experts", default=1)
    return MoeConfig(
        num_experts=read_int(raw, "num_local_experts", "num_experts", lo=1),
        top_k=read_int(raw, "num_experts_per_tok"),
        intermediate_size=read_int(raw, "intermediate_size"),
        shared_intermediate_size=n_shared * read_int(raw, "shared_intermediate_size", default=0),
        routed_scaling_factor=read_float(raw, "routed_scaling_factor", default=1.0),
        use_routing_bias=read_bool(raw, "use_routing_bias", True),
    )


def _parse_dense(raw: dict, family: Family) -> ModelConfig:
    hidden, n_layers, heads, kv_heads, head_dim = _attn_shape(raw)
    theta, rotary_dim, scaling = _rope_params(raw, head_dim)
    cfg = ModelConfig(
        family=family, architecture=_arch(raw), vocab_size=read_int(raw, "vocab_size", lo=1), hidden_size=hidden,
        num_layers=n_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim,
        rope_theta=theta, rope_scaling=scaling, rms_norm_eps=read_float(raw, "rms_norm_eps", default=1e-6),
        norm=NormKind.PLAIN, qk_norm=family is Family.QWEN3,
        qkv_bias=read_bool(raw, "attention_bias", family is Family.QWEN2),
        activation=_act(read_str(raw, "hidden_act", "silu")), swiglu_alpha=1.702, swiglu_limit=7.0,
        dense_intermediate_size=read_int(raw, "intermediate_size", lo=1),
        attn_kinds=(AttnKind.DENSE,) * n_layers, mlp_kinds=(MlpKind.DENSE,) * n_layers, msa=None, moe=None,
        tie_word_embeddings=read_bool(raw, "tie_word_embeddings", False),
        max_position_embeddings=read_int(raw, "max_position_embeddings", default=4096, lo=1),
        bos_token_id=read_optional_token_id(raw, "bos_token_id"), eos_token_ids=read_token_ids(raw, "eos_token_id"),
        quant=_quant(raw), vl_wrapper=False,
    )
    _validate(cfg)
    return cfg


def _validate(c: ModelConfig) -> None:
    """Inconsistent values are an error here, not a shape mismatch deep in a forward."""
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(c, name)}")
    if c.num_heads % c.num_kv_heads:
        raise ConfigError(f"num_attention_heads {c.num_heads} is not a multiple of num_key_value_heads {c.num_kv_heads}")
    if any(k is MlpKind.DENSE for k in c.mlp_kinds) and c.dense_intermediate_size <= 0:
        raise ConfigError("dense MLP layers need dense_intermediate_size > 0")
    if c.moe is not None:
        if not 0 < c.moe.top_k <= c.moe.num_experts:
            raise ConfigError(f"num_experts_per_tok {c.moe.top_k} must be in [1, num_local_experts={c.moe.num_experts}]")
        if c.moe.intermediate_size <= 0:
            raise ConfigError("MoE layers need intermediate_size > 0")
    if c.msa is not None:
        _validate_msa(c)


def _validate_msa(c: ModelConfig) -> None:
    m = c.msa
    assert m is not None
    if m.index_heads != c.num_kv_heads:
        raise ConfigError(f"MSA needs one index head per KV head: sparse_num_index_heads {m.index_heads} "
                          f"!= num_key_value_heads {c.num_kv_heads}")
    if m.index_dim < c.rotary_dim:
        raise ConfigError(f"sparse_index_dim {m.index_dim} is smaller than rotary_dim {c.rotary_dim}")
    if m.block_size <= 0 or m.topk_blocks <= 0:
        raise ConfigError("sparse_block_size and sparse_topk_blocks must be positive")
    if m.local_blocks + m.init_blocks > m.topk_blocks:
        raise ConfigError(f"sparse_local_block + sparse_init_block ({m.local_blocks + m.init_blocks}) "
                          f"exceeds sparse_topk_blocks {m.topk_blocks}")
