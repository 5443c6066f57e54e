"""A tiny random Eagle3 draft checkpoint that fits a tiny target (for `m3bench checkpoint tiny --draft`).

    write_tiny_draft(Path("tiny-eagle3"), target_dir=Path("tiny-m3"), seed=0)

The draft copies the target's hidden size, heads, KV heads, head_dim, vocabulary and rope_theta,
pins the target's default capture layers in `eagle_config`, and sets fc_norm / norm_output like
the real `Inferact/MiniMax-M3-EAGLE3`. With `draft_vocab_size` < vocab it also writes a random
d2t map (and t2d mask). Weights: norms 1 + 0.1 N(0,1), linears N(0,1) / sqrt(fan_in).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.speculative.config import EagleConfig, default_capture_layers
from m3bench.runtime.speculative.weights import expected_draft_tensors


def shipped_tiny_eagle3() -> Path:
    """The distilled Eagle3 draft shipped for the embedded tiny checkpoint (`write_tiny_checkpoint(seed=0)`):
    made by `m3bench checkpoint distill-draft` (assets/tiny-eagle3/README.md says how)."""
    return Path(__file__).resolve().parent / "assets" / "tiny-eagle3"


def tiny_draft_config(target: ModelConfig, draft_vocab_size: int | None = None) -> EagleConfig:
    """The EagleConfig of a draft for `target` (hidden = target hidden)."""
    h = target.hidden_size
    return EagleConfig(
        hidden_size=h, num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
        intermediate_size=2 * h, rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        vocab_size=target.vocab_size, draft_vocab_size=draft_vocab_size or target.vocab_size, fc_norm=True,
        norm_output=True, target_hidden_size=h, aux_layer_ids=default_capture_layers(target.num_layers),
        max_position_embeddings=target.max_position_embeddings,
    )


def random_draft_tensors(cfg: EagleConfig, seed: int, dtype: torch.dtype = torch.bfloat16,
                         with_lm_head: bool = True) -> dict[str, torch.Tensor]:
    """Canonical-name tensors for `cfg`, drawn from a local generator."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_draft_tensors(cfg).items():
        if name != "d2t":
            out[name] = _random(shape, g).to(dtype)
    if with_lm_head:
        out["lm_head.weight"] = _random((cfg.draft_vocab_size, cfg.hidden_size), g).to(dtype)
    if cfg.has_vocab_map:
        chosen = torch.randperm(cfg.vocab_size, generator=g)[:cfg.draft_vocab_size].sort().values
        out["d2t"] = chosen - torch.arange(cfg.draft_vocab_size)
        out["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, chosen, True)
    return out


def _random(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    return torch.randn(shape, generator=g) / shape[1] ** 0.5


def write_tiny_draft(dest: Path | str, target_dir: Path | str, seed: int = 0, draft_vocab_size: int | None = None,
                     dtype: torch.dtype = torch.bfloat16, midlayer_names: bool = False) -> EagleConfig:
    """Write config.json + model.safetensors of a random draft for the target at `target_dir`."""
    cfg = tiny_draft_config(ModelConfig.from_pretrained(target_dir), draft_vocab_size)
    tensors = random_draft_tensors(cfg, seed, dtype)
    if midlayer_names:
        tensors = {k.replace("layers.0.", "midlayer.", 1): v for k, v in tensors.items()}
    write_draft_dir(dest, cfg, tensors, dtype)
    return cfg


def write_draft_dir(dest: Path | str, cfg: EagleConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> Path:
    """config.json (with torch_dtype) and model.safetensors of `tensors` cast to `dtype` (d2t stays integer)."""
    from safetensors.torch import save_file

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps({**cfg.to_dict(), "torch_dtype": str(dtype).split(".")[-1]},
                                                 indent=2) + "\n")
    cast = {k: (v if not v.is_floating_point() else v.to(dtype)).contiguous() for k, v in tensors.items()}
    save_file(cast, str(dest / "model.safetensors"))
    return dest
