"""Eagle3 draft config (`LlamaForCausalLMEagle3` config.json) and the user's speculative settings.

    draft_cfg = EagleConfig.from_pretrained(Path("eagle3"))
    spec = SpecConfig(draft_dir=Path("eagle3"), draft_len=3)
    layers = spec.resolved_capture_layers(target_num_layers=60, draft=draft_cfg)   # (2, 30, 57)

Capture layer ids follow vLLM's `eagle_aux_hidden_state_layer_ids` convention: id j is the target's
residual stream at the *input* of layer j (= the output of layer j - 1; 0 is the embedding output).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from m3bench.runtime.config import read_config_json
from m3bench.runtime.errors import ConfigError

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "EAGLE3LlamaForCausalLM")
# keys that carry nothing the draft forward needs (Hugging Face boilerplate); any other unknown key is an error
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "attention_dropout", "initializer_range", "pretraining_tp", "torch_dtype",
    "dtype", "transformers_version", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "max_position_embeddings", "tie_word_embeddings", "_name_or_path", "mlp_bias", "attention_bias",
    "num_hidden_layers", "hidden_act", "rope_scaling", "rope_parameters", "use_sliding_window",
    "sliding_window", "max_window_layers",
})
USED_KEYS = frozenset({
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "rms_norm_eps", "rope_theta", "vocab_size", "draft_vocab_size", "fc_norm", "norm_output",
    "target_hidden_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
})
# eagle_config options and the only value of each this draft implements
EAGLE_OPTIONS = {
    "use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
    "next_layer_regular": True, "eh_proj_before_attn": False, "norm_before_fc": False,
    "use_mtp_layernorm": False,
}


@dataclass(frozen=True)
class EagleConfig:
    """One-layer Eagle3 draft: plain RMSNorm, full NeoX RoPE, GQA attention with 2H inputs, SiLU MLP."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    fc_norm: bool  # each captured feature normed by its own fc_norm.i before fc
    norm_output: bool  # feed the post-norm hidden back as the next step's feature (else the pre-norm sum)
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # capture layers pinned by the checkpoint, if any
    max_position_embeddings: int | None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_aux_layers(self) -> int:
        return len(self.aux_layer_ids) if self.aux_layer_ids else 3

    @property
    def has_vocab_map(self) -> bool:
        """Draft vocabulary smaller than the target's: draft id i means target id i + d2t[i]."""
        return self.draft_vocab_size != self.vocab_size

    @classmethod
    def from_pretrained(cls, path: Path | str) -> "EagleConfig":
        """Parse `path/config.json` (or a config.json path itself)."""
        return cls.from_dict(read_config_json(path, "Eagle3 config.json"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EagleConfig":
        if not isinstance(raw, dict):
            raise ConfigError("Eagle3 config.json must hold a JSON object")
        _check_keys(raw)
        _check_fixed(raw)
        hidden = int(_req(raw, "hidden_size"))
        heads = int(_req(raw, "num_attention_heads"))
        vocab = int(_req(raw, "vocab_size"))
        eagle = raw.get("eagle_config") or {}
        cfg = cls(
            hidden_size=hidden, num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(_req(raw, "intermediate_size")),
            rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-6), rope_theta=_rope_theta(raw),
            vocab_size=vocab, draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
            fc_norm=bool(raw.get("fc_norm", False)),
            norm_output=bool(raw.get("norm_output", False) or eagle.get("return_hidden_post_norm", False)),
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            aux_layer_ids=_aux_ids(raw, eagle), max_position_embeddings=raw.get("max_position_embeddings"),
        )
        _validate(cfg)
        return cfg

    def check_target(self, target: Any) -> None:
        """Raise ConfigError unless this draft fits `target` (a runtime ModelConfig)."""
        if self.target_hidden_size != target.hidden_size:
            raise ConfigError(f"draft target_hidden_size {self.target_hidden_size} != target hidden_size "
                              f"{target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise ConfigError(f"draft vocab_size {self.vocab_size} != target vocab_size {target.vocab_size}")
        if self.hidden_size != target.hidden_size:
            raise ConfigError(f"draft hidden_size {self.hidden_size} != target hidden_size {target.hidden_size}: "
                              "the target's embed_tokens cannot be shared")

    def to_dict(self) -> dict[str, Any]:
        """A config.json this parser reads back to an equal EagleConfig."""
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[0]], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_act": "silu", "hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "rope_scaling": None, "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size, "fc_norm": self.fc_norm, "norm_output": self.norm_output,
            "target_hidden_size": self.target_hidden_size, "tie_word_embeddings": False,
        }
        if self.max_position_embeddings is not None:
            d["max_position_embeddings"] = self.max_position_embeddings
        if self.aux_layer_ids is not None:
            d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        return d


def _req(raw: dict, key: str) -> Any:
    if raw.get(key) is None:
        raise ConfigError(f"Eagle3 config.json lacks required field {key!r}")
    return raw[key]


def _check_keys(raw: dict) -> None:
    unknown = sorted(set(raw) - IGNORED_KEYS - USED_KEYS)
    if unknown:
        raise ConfigError(f"Eagle3 config.json has unknown keys: {', '.join(unknown)}")
    eagle = raw.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ConfigError("eagle_config must be a JSON object")
    extra = sorted(set(eagle) - set(EAGLE_OPTIONS) - {"eagle_aux_hidden_state_layer_ids", "return_hidden_post_norm"})
    if extra:
        raise ConfigError(f"eagle_config has unknown keys: {', '.join(extra)}")
    for k, want in EAGLE_OPTIONS.items():
        if k in eagle and bool(eagle[k]) != want:
            raise ConfigError(f"eagle_config.{k}={eagle[k]!r} is not supported (only {want})")


def _check_fixed(raw: dict) -> None:
    """Values the one-layer Llama-style draft cannot deviate from."""
    archs = raw.get("architectures") or [ARCHITECTURES[0]]
    if archs[0] not in ARCHITECTURES:
        raise ConfigError(f"unsupported draft architecture {archs[0]!r} (supported: {', '.join(ARCHITECTURES)})")
    checks = (("num_hidden_layers", 1), ("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False))
    for key, want in checks:
        if raw.get(key, want) != want:
            raise ConfigError(f"Eagle3 draft needs {key}={want!r}, got {raw[key]!r}")
    rope = raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else rope
    params = raw.get("rope_parameters") or {}
    if kind not in (None, "default") or params.get("rope_type", "default") != "default":
        raise ConfigError(f"Eagle3 draft rope scaling {kind or params.get('rope_type')!r} is not supported")


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ConfigError("Eagle3 config.json lacks rope_theta")
    return float(theta)


def _aux_ids(raw: dict, eagle: dict) -> tuple[int, ...] | None:
    ids = eagle.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ConfigError(f"eagle_aux_hidden_state_layer_ids must be a non-empty list of layer ids, got {ids!r}")
    return tuple(ids)


def _validate(c: EagleConfig) -> None:
    for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
                 "draft_vocab_size", "target_hidden_size"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"Eagle3 {name} must be positive, got {getattr(c, name)}")
    if c.num_heads % c.num_kv_heads:
        raise ConfigError(f"Eagle3 num_attention_heads {c.num_heads} is not a multiple of "
                          f"num_key_value_heads {c.num_kv_heads}")
    if c.head_dim % 2:
        raise ConfigError(f"Eagle3 head_dim {c.head_dim} must be even (RoPE pairs)")
    if c.draft_vocab_size > c.vocab_size:
        raise ConfigError(f"draft_vocab_size {c.draft_vocab_size} exceeds vocab_size {c.vocab_size}")


class DraftKVLayout(Enum):
    SEPARATE = "separate"  # own pool and block tables, own page size (TensorRT-LLM ran 32)
    SHARED = "shared"  # one more layer in the target's pool: same page ids, same page size


MAX_DRAFT_LEN = 15  # MSA decode takes 1..16 query tokens per request: 1 + draft_len
SEPARATE_PAGE_SIZE = 32


def default_capture_layers(num_layers: int) -> tuple[int, int, int]:
    """Capture layers for a target of `num_layers` layers.

    L >= 7: (2, L // 2, L - 3), the layers vLLM / TensorRT-LLM use ((2, 30, 57) for M3's 60).
    L < 7 (tiny test targets, where that triple is not increasing): (0, L // 2, L - 1), i.e. the
    embedding output, the middle and the input of the last layer; ids may repeat for L <= 2.
    """
    if num_layers <= 0:
        raise ConfigError(f"target needs at least one layer, got {num_layers}")
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    return (0, num_layers // 2, num_layers - 1)


@dataclass(frozen=True)
class SpecConfig:
    """What the user asked of speculative decoding (one-model Eagle3, chain drafts)."""

    draft_dir: Path
    draft_len: int = 3
    draft_kv: DraftKVLayout = DraftKVLayout.SEPARATE
    draft_page_size: int | None = None  # None: 32 for SEPARATE, the target's page size for SHARED
    capture_layers: tuple[int, ...] | None = None  # None: the checkpoint's aux ids, else the default rule
    synthetic_acceptance_length: float | None = None  # forced mean AL in [1, 1 + draft_len]; outputs not the model's
    seed: int = 0  # seeds the synthetic-acceptance generator

    def __post_init__(self) -> None:
        object.__setattr__(self, "draft_dir", Path(self.draft_dir))
        if not 1 <= self.draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(f"draft_len must be in [1, {MAX_DRAFT_LEN}], got {self.draft_len}")
        if not isinstance(self.draft_kv, DraftKVLayout):
            raise ConfigError(f"draft_kv must be a DraftKVLayout, got {self.draft_kv!r}")
        if self.draft_page_size is not None and self.draft_page_size <= 0:
            raise ConfigError(f"draft_page_size must be positive, got {self.draft_page_size}")
        al = self.synthetic_acceptance_length
        if al is not None and not 1.0 <= al <= 1.0 + self.draft_len:
            raise ConfigError(f"synthetic_acceptance_length must be in [1, 1 + draft_len = {1 + self.draft_len}], "
                              f"got {al}")

    def resolved_page_size(self, target_page_size: int) -> int:
        """Tokens per draft KV page: SHARED must use the target's pages."""
        if self.draft_kv is DraftKVLayout.SHARED:
            if self.draft_page_size not in (None, target_page_size):
                raise ConfigError(f"a SHARED draft KV uses the target's page size {target_page_size}, "
                                  f"not {self.draft_page_size}")
            return target_page_size
        return self.draft_page_size or SEPARATE_PAGE_SIZE

    def resolved_capture_layers(self, target_num_layers: int, draft: EagleConfig) -> tuple[int, ...]:
        """The explicit setting, else the checkpoint's aux ids, else `default_capture_layers`."""
        ids = self.capture_layers or draft.aux_layer_ids or default_capture_layers(target_num_layers)
        if len(ids) != draft.num_aux_layers:
            raise ConfigError(f"{len(ids)} capture layers for a draft whose fc takes {draft.num_aux_layers} features")
        bad = [i for i in ids if not 0 <= i < target_num_layers]
        if bad:
            raise ConfigError(f"capture layers {bad} outside the target's layers [0, {target_num_layers})")
        return tuple(ids)
