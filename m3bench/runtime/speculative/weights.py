"""Eagle3 draft checkpoint names: read either scheme, expose one canonical scheme, check it strictly.

Canonical names (H draft hidden, Ht target hidden, n capture layers, Vd draft vocabulary):
```
fc.weight                                     [H, n * Ht]
fc_norm.{0..n-1}.weight                       [Ht]      (fc_norm: true only)
layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight   [H]
layers.0.self_attn.{q,k,v}_proj.weight        [Hq * d, 2H], [Hkv * d, 2H], [Hkv * d, 2H]
layers.0.self_attn.o_proj.weight              [H, Hq * d]
layers.0.mlp.{gate,up}_proj.weight            [I, H];  layers.0.mlp.down_proj.weight [H, I]
norm.weight                                   [H]
lm_head.weight                                [Vd, H]   optional (absent: the target's)
d2t                                           [Vd]      required when Vd < V
t2d                                           [V]       optional, unused (implied by d2t)
embed_tokens.weight                           [V, H]    optional, unused (the target's is shared)
```
Files may say `midlayer.` for `layers.0.` and may prefix everything with `model.`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.speculative.config import EagleConfig

OPTIONAL = ("lm_head.weight", "t2d", "embed_tokens.weight")


def canonical_name(name: str) -> str:
    """`model.midlayer.x` / `midlayer.x` / `layers.0.x` -> `layers.0.x`."""
    name = name.removeprefix("model.")
    if name.startswith("midlayer."):
        return "layers.0." + name.removeprefix("midlayer.")
    return name


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `path` (the draft is one layer), except the
    embedding: the target's is shared, so the draft's copy ([V, H], 2.4 GB for M3) is never read."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in draft checkpoint {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():
                if canonical_name(name) != "embed_tokens.weight":
                    out[name] = sf.get_tensor(name)
    return out


def canonical_draft_tensors(source: Path | str | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of a draft checkpoint dir (or map) under canonical names; a name given twice is an error."""
    raw = read_safetensors_dir(Path(source)) if isinstance(source, (str, Path)) else dict(source)
    out: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        canon = canonical_name(name)
        if canon in out:
            raise CheckpointError(f"draft tensor {canon!r} appears under two names")
        out[canon] = t
    return out


def expected_draft_tensors(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
    """The required canonical tensors and their shapes."""
    h, ht, n, i = cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux_layers, cfg.intermediate_size
    p = "layers.0."
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, n * ht)}
    if cfg.fc_norm:
        shapes.update({f"fc_norm.{k}.weight": (ht,) for k in range(n)})
    shapes.update({f"{p}{m}.weight": (h,) for m in ("input_layernorm", "hidden_norm", "post_attention_layernorm")})
    a = f"{p}self_attn."
    shapes.update({f"{a}q_proj.weight": (cfg.q_size, 2 * h), f"{a}k_proj.weight": (cfg.kv_size, 2 * h),
                   f"{a}v_proj.weight": (cfg.kv_size, 2 * h), f"{a}o_proj.weight": (h, cfg.q_size)})
    m = f"{p}mlp."
    shapes.update({f"{m}gate_proj.weight": (i, h), f"{m}up_proj.weight": (i, h), f"{m}down_proj.weight": (h, i)})
    shapes["norm.weight"] = (h,)
    if cfg.has_vocab_map:
        shapes["d2t"] = (cfg.draft_vocab_size,)
    return shapes


def _optional_shapes(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
    return {"lm_head.weight": (cfg.draft_vocab_size, cfg.hidden_size), "t2d": (cfg.vocab_size,),
            "embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "d2t": (cfg.draft_vocab_size,)}


def check_draft_tensors(cfg: EagleConfig, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise CheckpointError naming missing, extra and mis-shaped tensors, and a bad d2t map."""
    want = expected_draft_tensors(cfg)
    allowed = {**_optional_shapes(cfg), **want}
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(allowed))
    shaped = sorted(f"{k} {tuple(t.shape)} != {allowed[k]}" for k, t in tensors.items()
                    if k in allowed and tuple(t.shape) != allowed[k])
    problems = [f"missing: {', '.join(missing)}"] * bool(missing) + [f"unexpected: {', '.join(extra)}"] * bool(extra)
    problems += [f"mis-shaped: {', '.join(shaped)}"] * bool(shaped)
    if problems:
        raise CheckpointError("draft checkpoint does not match its config.json: " + "; ".join(problems))
    if "d2t" in tensors:
        _check_d2t(cfg, tensors["d2t"])


def _check_d2t(cfg: EagleConfig, d2t: torch.Tensor) -> None:
    target = torch.arange(cfg.draft_vocab_size) + d2t.to(torch.int64).cpu()
    if int(target.min()) < 0 or int(target.max()) >= cfg.vocab_size:
        raise CheckpointError(f"d2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})")
    if target.unique().numel() != target.numel():
        raise CheckpointError("d2t maps two draft ids to one target id")
