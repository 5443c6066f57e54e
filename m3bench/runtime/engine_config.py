"""EngineConfig: everything that builds an engine, one frozen, validated object (imports no torch).

    cfg = EngineConfig(model=Path("ckpt"), kv_cache_dtype=KVCacheDtype.FP8, draft=Path("eagle3"))
    cfg = resolve(cfg)            # this machine's facts: device, dtype, CUDA graphs and overlap decided
    llm = LLM.from_config(cfg)

What the user asked for stays apart from what was found at start-up: `device="auto"`, `dtype=AUTO`,
`cuda_graphs=None` and `async_scheduling=None` mean "decide on this machine", and `resolve` is the one
place that decides them (the dtype rule, the graphs and overlap defaults). Fields are parsed once in
`__post_init__` (strings become enums; bad values raise InputError naming the field), so every
command, backend and worker that holds an EngineConfig holds a valid one. Adding a field: give it a
default, check it in `_check_*`, and add its flag to m3bench/cli/engine_flags.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from m3bench.runtime.errors import InputError

MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds
MAX_DRAFT_LEN = 15
DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


class LoadFormat(Enum):
    AUTO = "auto"  # weights from the checkpoint's safetensors
    DUMMY = "dummy"  # random weights (benchmarking); only config.json is read


class DType(Enum):
    AUTO = "auto"  # bfloat16 on CUDA, float32 on CPU (resolve)
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT64 = "float64"


DTYPE_ALIASES = {"fp32": DType.FLOAT32, "bf16": DType.BFLOAT16, "fp16": DType.FLOAT16, "fp64": DType.FLOAT64}


class KVCacheDtype(Enum):  # the values of runtime.kv_cache.KVDtype (tests/runtime/test_engine_config.py)
    AUTO = "auto"  # the model's compute dtype
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    HYBRID = "hybrid"  # MSA layers NVFP4, dense layers FP8


class DraftKV(Enum):  # the values of runtime.speculative.config.DraftKVLayout
    SEPARATE = "separate"
    SHARED = "shared"


class WeightsDtype(Enum):  # runtime.fit_check.resident_format reads it
    AUTO = "auto"  # a quantized checkpoint as stored (MXFP8 linear layers, NVFP4 routed experts)
    BFLOAT16 = "bfloat16"  # dequantized to the model dtype on load


class AttentionBackend(Enum):  # the values of runtime.attention.select.AttentionChoice
    AUTO = "auto"  # Triton on CUDA, torch on CPU
    TORCH = "torch"
    TRITON = "triton"


@dataclass(frozen=True)
class EngineConfig:
    """How to build one engine (runtime.LLM.from_config); see the module docstring."""

    model: Path | None = None  # checkpoint directory (load_format dummy: one holding config.json)
    load_format: LoadFormat = LoadFormat.AUTO
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: DType = DType.AUTO
    kv_cache_dtype: KVCacheDtype = KVCacheDtype.AUTO
    tokens_per_block: int = 128  # KV page size
    max_batch_size: int = 64
    max_num_tokens: int = 2048  # token budget of one step (chunked prefill)
    num_kv_blocks: int | None = None  # None: sized from free memory (CUDA), 16384 tokens (CPU)
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    cuda_graphs: bool | None = None  # None: on for CUDA at TP 1
    async_scheduling: bool | None = None  # overlap; None: on for CUDA at TP 1 (speculation too)
    attention_backend: AttentionBackend = AttentionBackend.AUTO
    tensor_parallel_size: int = 1
    attention_dp: bool = False  # with tensor_parallel_size N: N engines, attention data-parallel, MoE expert-parallel
    seed: int = 0  # engine sampler and dummy weights
    draft: Path | None = None  # Eagle3 draft directory: speculative decoding
    draft_len: int = 3
    draft_kv: DraftKV = DraftKV.SEPARATE
    synthetic_acceptance: float | None = None  # forced mean acceptance length (needs a draft)
    draft_page_size: int | None = None  # the separate draft pool's page size (None: the draft's default)
    max_model_len: int | None = None  # context a request may reach (None: what positions and the KV pool allow)
    weights_dtype: WeightsDtype = WeightsDtype.AUTO

    def __post_init__(self) -> None:
        for name, enum in ENUM_FIELDS.items():
            object.__setattr__(self, name, parse_enum(enum, getattr(self, name), name))
        for name in ("model", "draft"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        _check_sizes(self)
        _check_device(self.device)
        _check_speculation(self)
        _check_attention_dp(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EngineConfig":
        """Strict: an unknown key is an InputError naming it."""
        unknown = sorted(set(raw) - set(FIELD_NAMES))
        if unknown:
            raise InputError(f"unknown engine settings {unknown}; known: {list(FIELD_NAMES)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: enums as their values, paths as strings (records, fingerprints)."""
        return {f: _plain(getattr(self, f)) for f in FIELD_NAMES}

    @property
    def is_resolved(self) -> bool:
        return (self.device != "auto" and self.dtype is not DType.AUTO and self.cuda_graphs is not None
                and self.async_scheduling is not None)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


ENUM_FIELDS = {"load_format": LoadFormat, "dtype": DType, "kv_cache_dtype": KVCacheDtype,
               "attention_backend": AttentionBackend, "draft_kv": DraftKV,
               "weights_dtype": WeightsDtype}
FIELD_NAMES = tuple(f.name for f in fields(EngineConfig))


def parse_enum(enum: type[Enum], value: Any, name: str) -> Enum:
    """`value` (an enum member or its value) as a member of `enum`, or an InputError naming the choices."""
    if isinstance(value, enum):
        return value
    if enum is DType and str(value) in DTYPE_ALIASES:
        return DTYPE_ALIASES[str(value)]
    try:
        return enum(getattr(value, "value", value))
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise InputError(f"unknown {name} {value!r} (choose from {choices})") from None


def supported_page_size(tokens_per_block: int) -> bool:
    """A KV page is a power of two or a multiple of 64 tokens (the kernels tile keys by min(P, 64))."""
    p = tokens_per_block
    return p >= 1 and (p & (p - 1) == 0 or p % 64 == 0)


def _check_sizes(c: EngineConfig) -> None:
    for name in ("tokens_per_block", "max_batch_size", "max_num_tokens", "tensor_parallel_size", "draft_len"):
        if getattr(c, name) < 1:
            raise InputError(f"{name} must be >= 1, got {getattr(c, name)}")
    if not supported_page_size(c.tokens_per_block):
        raise InputError(f"tokens_per_block {c.tokens_per_block} is not a supported page size "
                         "(a power of two, or a multiple of 64)")
    if c.max_model_len is not None and c.max_model_len < 2:
        raise InputError(f"max_model_len must be >= 2, got {c.max_model_len}")
    if c.num_kv_blocks is not None and c.num_kv_blocks < 1:
        raise InputError(f"num_kv_blocks must be >= 1, got {c.num_kv_blocks}")
    if not 0.0 < c.gpu_memory_utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {c.gpu_memory_utilization}")
    if not 0 <= c.seed <= MAX_SEED:
        raise InputError(f"seed must be in [0, 2**63 - 1], got {c.seed}")


def _check_device(device: str) -> None:
    if not isinstance(device, str) or not DEVICE_RE.match(device):
        raise InputError(f"unknown device {device!r} (choose from auto, cpu, cuda, cuda:N)")


def _check_speculation(c: EngineConfig) -> None:
    if c.draft_len > MAX_DRAFT_LEN:
        raise InputError(f"draft_len must be <= {MAX_DRAFT_LEN}, got {c.draft_len}")
    if c.synthetic_acceptance is not None and not math.isfinite(c.synthetic_acceptance):
        raise InputError(f"synthetic_acceptance must be a finite number, got {c.synthetic_acceptance}")
    if c.synthetic_acceptance is not None and c.draft is None:
        raise InputError("synthetic acceptance forces the acceptance of draft tokens: it needs --draft DIR")
    if c.draft_page_size is not None and not supported_page_size(c.draft_page_size):
        raise InputError(f"draft_page_size {c.draft_page_size} is not a supported page size")


def _check_attention_dp(c: EngineConfig) -> None:
    if c.attention_dp and c.tensor_parallel_size == 1:
        raise InputError("attention_dp needs tensor_parallel_size > 1 (--attention-dp --tp N: N ranks, each with "
                         "its own requests and KV cache, the MoE experts split over them)")


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


# ---- start-up facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    """What this machine has (found at start-up, never asked of the user)."""

    cuda_devices: int

    @classmethod
    def probe(cls) -> "DeviceFacts":
        import torch

        return cls(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def resolve(cfg: EngineConfig, facts: DeviceFacts | None = None) -> EngineConfig:
    """Decide every "auto" on this machine (InputError when the machine cannot run what was asked)."""
    facts = DeviceFacts.probe() if facts is None else facts
    device = resolve_device(cfg.device, facts, cfg.tensor_parallel_size)
    cuda = device.startswith("cuda")
    dtype = auto_dtype(cuda) if cfg.dtype is DType.AUTO else cfg.dtype
    graphs = default_cuda_graphs(cuda, cfg) if cfg.cuda_graphs is None else cfg.cuda_graphs
    overlap = default_overlap(cuda, cfg) if cfg.async_scheduling is None else cfg.async_scheduling
    out = replace(cfg, device=device, dtype=dtype, cuda_graphs=graphs, async_scheduling=overlap)
    check_modes(out)
    return out


def resolve_device(device: str, facts: DeviceFacts, tp: int = 1) -> str:
    """auto -> cuda when this machine has a CUDA device, else cpu; cuda / cuda:N must exist (N + tp ranks)."""
    if device == "auto":
        return "cuda" if facts.cuda_devices else "cpu"
    if device == "cpu":
        return device
    if facts.cuda_devices == 0:
        raise InputError(f"device {device!r} but CUDA is not available on this machine: pass --device cpu")
    first = int(device.split(":")[1]) if ":" in device else 0
    if first + tp > facts.cuda_devices:
        raise InputError(f"device {device!r} with {tp} rank(s) needs {first + tp} CUDA devices, "
                         f"this machine has {facts.cuda_devices}")
    return device


def auto_dtype(cuda: bool) -> DType:
    """The one dtype rule: bfloat16 on CUDA, float32 on CPU."""
    return DType.BFLOAT16 if cuda else DType.FLOAT32


def default_cuda_graphs(cuda: bool, cfg: EngineConfig) -> bool:
    """On for CUDA at TP 1 with a graph-safe attention backend (TP does not capture graphs yet)."""
    return cuda and cfg.tensor_parallel_size == 1 and cfg.attention_backend is not AttentionBackend.TORCH


def default_overlap(cuda: bool, cfg: EngineConfig) -> bool:
    """Overlap scheduling: on for CUDA at TP 1 without speculation (1.09-1.19x decode tok/s on the H200 with
    identical tokens, benchmarks/overlap_speed.py); off on CPU (nothing to overlap). With speculation (the
    drafts stay on the device, the next step is built while the draft runs: lossless on CPU) and at TP > 1
    (lossless on CPU ranks) only when asked (--async-scheduling): neither has run on a GPU yet."""
    return cuda and cfg.tensor_parallel_size == 1 and cfg.draft is None


def check_modes(c: EngineConfig) -> None:
    """The combinations the engine cannot run (yet), named the way the flags are."""
    if c.cuda_graphs and not c.on_cuda:
        raise InputError("cuda_graphs needs a CUDA device (pass --no-cuda-graphs on CPU)")
    if c.cuda_graphs and c.tensor_parallel_size > 1:
        raise InputError("tensor_parallel_size > 1 does not capture cuda_graphs yet: run without them")
    if c.cuda_graphs and c.attention_backend is AttentionBackend.TORCH:
        raise InputError("cuda_graphs needs a graph-safe attention backend; the torch backend reads host lengths")
