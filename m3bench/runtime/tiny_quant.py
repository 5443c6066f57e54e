"""Quantized tiny checkpoints in the published layouts of MiniMax-M3-MXFP8 and the ModelOpt NVFP4 release.

    named = quantize_file_tensors(named, TinyQuant.MXFP8)   # file name -> tensor, as tiny.file_tensors gives
    cfg_json["quantization_config"] = quantization_config(TinyQuant.MXFP8)

MXFP8: every linear `.weight` becomes float8_e4m3fn [out, in] plus `.weight_scale_inv` uint8 E8M0
[out, in/32]; embeddings, lm_head, routers (`block_sparse_moe.gate`), the correction bias and norms stay
as they are. NVFP4 (ModelOpt MIXED_PRECISION): routed experts NVFP4 (`weight` uint8 [out, in/2],
`weight_scale` e4m3 [out, in/16], `weight_scale_2` and `input_scale` fp32 scalars), the other linear
layers MXFP8. Names otherwise as the bf16 release (M3 / VL layouts).
"""

from __future__ import annotations

import re
from enum import Enum

import torch

from m3bench.runtime import quant


class TinyQuant(Enum):
    NONE = "none"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"  # routed experts NVFP4, the rest MXFP8


UNQUANTIZED = re.compile(r".*(embed_tokens|lm_head|norm|block_sparse_moe\.gate)\.weight$")
ROUTED_EXPERT = re.compile(r".*block_sparse_moe\.experts\.\d+\.w[123]\.weight$")


def quantization_config(fmt: TinyQuant) -> dict | None:
    """The config.json `quantization_config` of a checkpoint in fmt (None for unquantized)."""
    if fmt is TinyQuant.MXFP8:
        return {"quant_method": "mxfp8", "weight_block_size": [1, 32], "activation_scheme": "dynamic",
                "fmt": "e4m3", "scale_fmt": "e8m0",
                "modules_to_not_convert": ["lm_head", "embed_tokens", "block_sparse_moe.gate"]}
    if fmt is TinyQuant.NVFP4:
        return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "exclude_modules": ["lm_head", "*block_sparse_moe.gate"]}
    return None


def _quantizable(name: str, t: torch.Tensor) -> bool:
    return name.endswith(".weight") and t.dim() == 2 and not UNQUANTIZED.fullmatch(name)


def quantize_file_tensors(named: dict[str, torch.Tensor], fmt: TinyQuant) -> dict[str, torch.Tensor]:
    """File tensors (bf16 names) -> the same names in fmt, scales added beside each quantized weight."""
    if fmt is TinyQuant.NONE:
        return named
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        if not _quantizable(name, t):
            out[name] = t
            continue
        base = name[: -len("weight")]
        if fmt is TinyQuant.NVFP4 and ROUTED_EXPERT.fullmatch(name):
            packed, scale, scale_2 = quant.quant_nvfp4(t)
            out.update({name: packed, base + "weight_scale": scale, base + "weight_scale_2": scale_2,
                        base + "input_scale": torch.ones((), dtype=torch.float32)})
        else:
            data, scale = quant.quant_mxfp8(t)
            out.update({name: data, base + "weight_scale_inv": scale})
    return out
