"""Lazy safetensors reader that exposes every checkpoint naming scheme under one canonical one.

    reader = CheckpointReader(Path("ckpt"), cfg)
    reader.validate()                                              # CheckpointError: missing / extra / shapes
    w = reader.get("layers.3.attn.q_proj.weight", torch.bfloat16, Shard(dim=0, rank=1, world=4))
    reader.bytes_read                                              # tensor bytes read from disk so far

Accepted file schemes: M3 bf16 names (with or without `language_model.`), transformers-v5 names
(with or without `model.language_model.`; stacked experts, fused gate_up), Llama / Qwen names.
`get` dequantizes MXFP8 and NVFP4 weights (m3bench.runtime.quant); `get_mxfp8` returns MXFP8 weights as
stored (fp8 + E8M0 scales), and converts any other format to MXFP8 once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch
from safetensors import safe_open

from m3bench.runtime import quant
from m3bench.runtime.config import AttnKind, MlpKind, ModelConfig
from m3bench.runtime.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Top-level modules of a VL checkpoint (or extra heads) that the text model never reads.
SKIPPED_MODULES = ("vision_tower", "multi_modal_projector", "patch_merge_mlp", "mtp")
# Calibration scales of activations / KV: not needed to rebuild the weights.
SKIPPED_SUFFIXES = (".input_scale", ".k_scale", ".v_scale", ".output_scale", "rotary_emb.inv_freq")
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale_2", "weight_scale")
MAX_LISTED = 5

DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "U8": torch.uint8, "I8": torch.int8,
    "I32": torch.int32, "I64": torch.int64, "F8_E8M0": getattr(torch, "float8_e8m0fnu", torch.uint8),
}


class Quant(Enum):
    NONE = "none"
    MXFP8 = "mxfp8"  # fp8 e4m3 weight, one E8M0 exponent per 32 inputs
    NVFP4 = "nvfp4"  # two E2M1 a byte, one e4m3 scale per 16 inputs, one fp32 global scale


@dataclass(frozen=True)
class Shard:
    """A contiguous 1/world slice of a canonical tensor along `dim` (rank r takes the r-th piece)."""

    dim: int
    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"shard rank {self.rank} outside world {self.world}")

    def bounds(self, size: int) -> tuple[int, int]:
        if size % self.world:
            raise ValueError(f"dimension {size} does not split over world {self.world}")
        n = size // self.world
        return self.rank * n, (self.rank + 1) * n


@dataclass(frozen=True)
class FileTensor:
    """A tensor as stored: file, key, stored dtype name and shape."""

    file: Path
    key: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Source:
    """Where one canonical tensor lives: a whole file tensor, one expert of a stacked tensor,
    and/or a window of rows of a fused one (gate rows first, then up)."""

    data: FileTensor
    shape: tuple[int, ...]  # canonical (dequantized) shape
    expert: int | None = None
    row_offset: int = 0
    quant: Quant = Quant.NONE
    scale: FileTensor | None = None
    scale_2: FileTensor | None = None


# --- the canonical schema ------------------------------------------------------------------------

def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor name the model needs, with its shape."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h), "norm.weight": (h,)}
    for i in range(cfg.num_layers):
        out.update(_layer_tensors(cfg, i))
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    return out


def _layer_tensors(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    h, d, p = cfg.hidden_size, cfg.head_dim, f"layers.{i}."
    out = {p + "input_norm.weight": (h,), p + "post_attn_norm.weight": (h,),
           p + "attn.q_proj.weight": (cfg.q_size, h), p + "attn.k_proj.weight": (cfg.kv_size, h),
           p + "attn.v_proj.weight": (cfg.kv_size, h), p + "attn.o_proj.weight": (h, cfg.q_size)}
    if cfg.qkv_bias:
        out.update({p + "attn.q_proj.bias": (cfg.q_size,), p + "attn.k_proj.bias": (cfg.kv_size,),
                    p + "attn.v_proj.bias": (cfg.kv_size,)})
    if cfg.qk_norm:
        out.update({p + "attn.q_norm.weight": (d,), p + "attn.k_norm.weight": (d,)})
    if cfg.attn_kinds[i] is AttnKind.MSA:
        m = cfg.msa
        out.update({p + "attn.index_q_proj.weight": (m.index_heads * m.index_dim, h),
                    p + "attn.index_k_proj.weight": (m.index_dim, h),
                    p + "attn.index_q_norm.weight": (m.index_dim,), p + "attn.index_k_norm.weight": (m.index_dim,)})
    if cfg.mlp_kinds[i] is MlpKind.MOE:
        out.update(_moe_tensors(cfg, p))
    else:
        out.update(_mlp_tensors(f"{p}mlp.", cfg.dense_intermediate_size, h))
    return out


def _mlp_tensors(p: str, inter: int, h: int) -> dict[str, tuple[int, ...]]:
    return {p + "gate_proj.weight": (inter, h), p + "up_proj.weight": (inter, h), p + "down_proj.weight": (h, inter)}


def _moe_tensors(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    m, h = cfg.moe, cfg.hidden_size
    out = {p + "moe.router.weight": (m.num_experts, h)}
    if m.use_routing_bias:
        out[p + "moe.router.bias"] = (m.num_experts,)
    for e in range(m.num_experts):
        out.update(_mlp_tensors(f"{p}moe.experts.{e}.", m.intermediate_size, h))
    if m.shared_intermediate_size:
        out.update(_mlp_tensors(f"{p}moe.shared.", m.shared_intermediate_size, h))
    return out


# --- file names -> canonical names ---------------------------------------------------------------

# Per-layer renames, applied to the part after `layers.L.`: one file tensor, one canonical tensor.
LAYER_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"input_layernorm\.weight", "input_norm.weight"),
    (r"post_attention_layernorm\.weight", "post_attn_norm.weight"),
    (r"self_attn\.([qkvo])_proj\.(weight|bias)", r"attn.\1_proj.\2"),
    (r"self_attn\.([qk])_norm\.weight", r"attn.\1_norm.weight"),
    (r"self_attn\.(?:index_|indexer\.)([qk])_(proj|norm)\.weight", r"attn.index_\1_\2.weight"),
    (r"mlp\.(gate|up|down)_proj\.weight", r"mlp.\1_proj.weight"),
    (r"(?:block_sparse_moe|mlp)\.gate\.weight", "moe.router.weight"),
    (r"(?:block_sparse_moe|mlp\.gate)\.e_score_correction_bias", "moe.router.bias"),
    (r"(?:block_sparse_moe|mlp)\.experts\.(\d+)\.w1\.weight", r"moe.experts.\1.gate_proj.weight"),
    (r"(?:block_sparse_moe|mlp)\.experts\.(\d+)\.w3\.weight", r"moe.experts.\1.up_proj.weight"),
    (r"(?:block_sparse_moe|mlp)\.experts\.(\d+)\.w2\.weight", r"moe.experts.\1.down_proj.weight"),
    (r"(?:block_sparse_moe|mlp)\.shared_experts\.(gate|up|down)_proj\.weight", r"moe.shared.\1_proj.weight"),
))
# Fused [2n, H] tensors (transformers v5): rows [0, n) are gate, [n, 2n) up.
FUSED_GATE_UP = tuple((re.compile(a), b) for a, b in (
    (r"mlp\.gate_up_proj\.weight", "mlp."),
    (r"mlp\.shared_experts\.gate_up_proj\.weight", "moe.shared."),
))
STACKED_GATE_UP = re.compile(r"mlp\.experts\.gate_up_proj")  # [E, 2I, H]
STACKED_DOWN = re.compile(r"mlp\.experts\.down_proj")  # [E, H, I]
LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")


def strip_prefix(key: str) -> str | None:
    """File key -> key relative to the text model's root (`layers.0...`, `lm_head.weight`); None: skip."""
    if key.startswith("language_model."):  # M3 VL wrapper: language_model.model.* / language_model.lm_head
        key = key[len("language_model."):]
    if key.startswith("model.language_model."):  # transformers-v5 VL export
        key = "model." + key[len("model.language_model."):]
    if key.startswith("model."):
        key = key[len("model."):]
    if key.split(".", 1)[0] in SKIPPED_MODULES or key.endswith(SKIPPED_SUFFIXES):
        return None
    return key


def _whole(t: FileTensor, name: str) -> list[tuple[str, Source]]:
    return [(name, Source(t, t.shape))]


def _halves(t: FileTensor, stem: str, expert: int | None = None) -> list[tuple[str, Source]]:
    rows, rest = (t.shape[1], t.shape[2:]) if expert is not None else (t.shape[0], t.shape[1:])
    n = rows // 2
    return [(f"{stem}gate_proj.weight", Source(t, (n, *rest), expert=expert)),
            (f"{stem}up_proj.weight", Source(t, (n, *rest), expert=expert, row_offset=n))]


def _layer_sources(layer: str, rest: str, t: FileTensor) -> list[tuple[str, Source]] | None:
    p = f"layers.{layer}."
    for pat, repl in LAYER_RENAMES:
        if pat.fullmatch(rest):
            return _whole(t, p + pat.sub(repl, rest))
    for pat, stem in FUSED_GATE_UP:
        if pat.fullmatch(rest):
            return _halves(t, p + stem)
    if STACKED_GATE_UP.fullmatch(rest) and len(t.shape) == 3:
        return [s for e in range(t.shape[0]) for s in _halves(t, f"{p}moe.experts.{e}.", expert=e)]
    if STACKED_DOWN.fullmatch(rest) and len(t.shape) == 3:
        return [(f"{p}moe.experts.{e}.down_proj.weight", Source(t, t.shape[1:], expert=e))
                for e in range(t.shape[0])]
    return None


def canonical_sources(t: FileTensor, key: str) -> list[tuple[str, Source]] | None:
    """The canonical tensors one file tensor provides ([] when skipped, None when unrecognised)."""
    rel = strip_prefix(key)
    if rel is None:
        return []
    if rel in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
        return _whole(t, rel)
    m = LAYER_KEY.fullmatch(rel)
    return _layer_sources(m.group(1), m.group(2), t) if m else None


# --- opening files -------------------------------------------------------------------------------

def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (sharded via the index, or one file)."""
    index = path / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({type(e).__name__}: {e})") from None
        return [path / f for f in sorted(set(weight_map.values()))]
    if (path / SINGLE_FILE).exists():
        return [path / SINGLE_FILE]
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")


def _open(file: Path):
    if not file.exists():
        raise CheckpointError(f"checkpoint file {file} is missing")
    try:
        return safe_open(str(file), framework="pt")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"cannot read {file}: {_one_line(e)}") from None


def _one_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _file_tensors(file: Path, handle) -> dict[str, FileTensor]:
    try:
        out = {}
        for key in handle.keys():
            s = handle.get_slice(key)
            out[key] = FileTensor(file, key, s.get_dtype(), tuple(s.get_shape()))
        return out
    except Exception as e:
        raise CheckpointError(f"cannot read {file}: {_one_line(e)}") from None


# --- the reader ----------------------------------------------------------------------------------

class CheckpointReader:
    """Canonical, lazy view of a checkpoint directory's tensors (see the module docstring).

    Opening reads only the safetensors headers; `get` reads the requested slice and adds its size
    to `bytes_read`."""

    def __init__(self, path: Path | str, cfg: ModelConfig):
        self.path, self.cfg = Path(path), cfg
        self.bytes_read = 0
        self.sources: dict[str, Source] = {}
        self.unrecognised: list[str] = []  # file keys no naming scheme knows
        self._handles: dict[Path, object] = {}
        stored: dict[str, FileTensor] = {}
        for f in checkpoint_files(self.path):
            self._handles[f] = _open(f)
            stored.update(_file_tensors(f, self._handles[f]))
        self._index(stored)

    def _index(self, stored: dict[str, FileTensor]) -> None:
        scales = {k for k in stored if k.rsplit(".", 1)[-1] in SCALE_SUFFIXES}
        for key, t in stored.items():
            if key in scales:
                continue
            found = canonical_sources(t, key)
            if found is None:
                self.unrecognised.append(key)
            for name, src in found or []:
                if name in self.sources:
                    raise CheckpointError(f"{name} is stored twice ({self.sources[name].data.key} and {key})")
                self.sources[name] = _with_quant(src, stored)

    # -- queries --
    def __contains__(self, name: str) -> bool:
        return name in self.sources

    def names(self) -> list[str]:
        return list(self.sources)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._source(name).shape

    def quant_of(self, name: str) -> Quant:
        return self._source(name).quant

    def validate(self) -> None:
        """Raise CheckpointError naming missing, extra and mis-shaped tensors (first few of each)."""
        want = expected_tensors(self.cfg)
        missing = [n for n in want if n not in self.sources]
        redundant = {"lm_head.weight"} if self.cfg.tie_word_embeddings else set()  # some exports keep the tied copy
        extra = self.unrecognised + [n for n in self.sources if n not in want and n not in redundant]
        bad = [f"{n} {self.sources[n].shape} (expected {s})" for n, s in want.items()
               if n in self.sources and self.sources[n].shape != s]
        bad += [p for n in want if n in self.sources for p in _scale_problems(n, self.sources[n])]
        problems = [_listing(what, items) for what, items in
                    (("missing", missing), ("unexpected", extra), ("mis-shaped", bad)) if items]
        if problems:
            raise CheckpointError(f"checkpoint {self.path} does not match its config: " + "; ".join(problems))

    def get(self, name: str, dtype: torch.dtype, shard: Shard | None = None) -> torch.Tensor:
        """The canonical tensor (or this shard of it), dequantized, as `dtype`."""
        src = self._source(name)
        window = _window(src.shape, shard)
        if src.quant is Quant.NONE:
            return self._read(src.data, _file_index(src, window)).to(dtype)
        return self._dequant(name, src, window, dtype)

    def get_mxfp8(self, name: str, shard: Shard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(float8_e4m3fn [rows, cols], uint8 E8M0 [rows, cols / 32]) of the tensor (or shard): MXFP8 as
        stored; any other format (bf16, NVFP4) is dequantized and quantized to MXFP8 once, here."""
        src = self._source(name)
        window = _window(src.shape, shard)
        if src.quant is Quant.MXFP8:
            data, scale = self._read_blocks(name, src, window)
            return data.view(torch.float8_e4m3fn), scale.view(torch.uint8)
        return quant.quant_mxfp8(self.get(name, torch.float32, shard))

    def get_nvfp4(self, name: str, shard: Shard | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(packed uint8 [rows, cols / 2], e4m3 [rows, cols / 16], fp32 scalar global) of the tensor (or shard):
        NVFP4 as stored; any other format is dequantized and quantized to NVFP4 once, here."""
        src = self._source(name)
        window = _window(src.shape, shard)
        if src.quant is Quant.NVFP4:
            data, scale = self._read_blocks(name, src, window)
            return data.view(torch.uint8), scale.view(torch.float8_e4m3fn), self._read(src.scale_2, ()).float()
        return quant.quant_nvfp4(self.get(name, torch.float32, shard))

    def close(self) -> None:
        self._handles.clear()

    # -- internals --
    def _source(self, name: str) -> Source:
        try:
            return self.sources[name]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.path} has no tensor {name}") from None

    def _read(self, t: FileTensor, index: tuple) -> torch.Tensor:
        try:
            x = self._handles[t.file].get_slice(t.key)[index] if index else self._handles[t.file].get_tensor(t.key)
        except Exception as e:
            raise CheckpointError(f"cannot read {t.key} from {t.file}: {_one_line(e)}") from None
        self.bytes_read += x.numel() * x.element_size()
        return x

    def _dequant(self, name: str, src: Source, window: list[tuple[int, int]], dtype: torch.dtype) -> torch.Tensor:
        data, scale = self._read_blocks(name, src, window)
        if src.quant is Quant.MXFP8:
            return quant.dequant_mxfp8(data, scale, dtype)
        return quant.dequant_nvfp4(data, scale, self._read(src.scale_2, ()), dtype)


    def _read_blocks(self, name: str, src: Source, window: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored data and block scales of a quantized tensor's window."""
        if len(src.shape) != 2:
            raise CheckpointError(f"{name}: quantized tensors must be 2-D, got {src.shape}")
        (r0, r1), (c0, c1) = window
        data_div = 2 if src.quant is Quant.NVFP4 else 1
        block = quant.NV_BLOCK if src.quant is Quant.NVFP4 else quant.MX_BLOCK
        if c0 % block or c1 % block:
            raise CheckpointError(f"{name}: shard columns [{c0}, {c1}) do not align to {block}-element scale blocks")
        data = self._read(src.data, _file_index(src, [(r0, r1), (c0 // data_div, c1 // data_div)]))
        scale = self._read(src.scale, _file_index(src, [(r0, r1), (c0 // block, c1 // block)]))
        return data, scale


def _listing(what: str, items: list[str]) -> str:
    more = f", ... ({len(items)} in all)" if len(items) > MAX_LISTED else ""
    return f"{len(items)} {what}: " + ", ".join(items[:MAX_LISTED]) + more


def _window(shape: tuple[int, ...], shard: Shard | None) -> list[tuple[int, int]]:
    """Per canonical dimension, the [start, stop) to read."""
    window = [(0, n) for n in shape]
    if shard is not None:
        if not shape:
            raise ValueError("a scalar tensor cannot be sharded")
        window[shard.dim % len(shape)] = shard.bounds(shape[shard.dim % len(shape)])
    return window


def _file_index(src: Source, window: list[tuple[int, int]]) -> tuple:
    """Index into the stored tensor for a canonical window (expert index, fused row offset)."""
    idx = [slice(a, b) for a, b in window]
    if idx:
        idx[0] = slice(window[0][0] + src.row_offset, window[0][1] + src.row_offset)
    if src.expert is not None:
        idx.insert(0, src.expert)
    return tuple(idx)


def _with_quant(src: Source, stored: dict[str, FileTensor]) -> Source:
    """Attach scale tensors to a quantized weight and give its canonical (dequantized) shape."""
    key = src.data.key
    if not key.endswith(".weight"):
        return src
    base = key[: -len("weight")]
    scale = stored.get(base + "weight_scale_inv") or stored.get(base + "weight_scale")
    scale_2 = stored.get(base + "weight_scale_2")
    if scale is None and scale_2 is None:
        if src.data.dtype in ("F8_E4M3", "U8"):
            raise CheckpointError(f"{key} is stored as {src.data.dtype} but has no weight_scale")
        return src
    kind = _quant_kind(src.data, scale, scale_2)
    shape = (src.shape[0], src.shape[1] * 2) if kind is Quant.NVFP4 else src.shape
    return Source(src.data, shape, src.expert, src.row_offset, kind, scale, scale_2)


def _quant_kind(data: FileTensor, scale: FileTensor | None, scale_2: FileTensor | None) -> Quant:
    if data.dtype == "F8_E4M3" and scale is not None and scale.dtype in ("U8", "F8_E8M0") and scale_2 is None:
        return Quant.MXFP8
    if data.dtype == "U8" and scale is not None and scale.dtype == "F8_E4M3" and scale_2 is not None:
        return Quant.NVFP4
    found = ", ".join(f"{t.key} {t.dtype}" for t in (data, scale, scale_2) if t is not None)
    raise CheckpointError(f"unsupported quantized weight ({found}); supported: MXFP8 (E8M0 scales), NVFP4")


def _scale_problems(name: str, src: Source) -> list[str]:
    """A scale must hold one entry per block of the stored weight's rows (fused halves share it)."""
    if src.quant is Quant.NONE:
        return []
    block = quant.NV_BLOCK if src.quant is Quant.NVFP4 else quant.MX_BLOCK
    cols = src.data.shape[-1] * (2 if src.quant is Quant.NVFP4 else 1)
    want = (*src.data.shape[:-1], cols // block)
    out = [] if (src.scale.shape == want and cols % block == 0) else [f"{name} scale {src.scale.shape} (expected {want})"]
    if src.scale_2 is not None and src.scale_2.shape not in ((), (1,)):
        out.append(f"{name} weight_scale_2 {src.scale_2.shape} (expected a scalar)")
    return out
