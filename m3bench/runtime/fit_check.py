"""The memory plan run before an engine loads: refuse with the plan's message instead of failing mid-load.

    check_engine_fits(Path("ckpt"), EngineFit(device="cuda", dtype="bfloat16", tensor_parallel_size=8))

The budget is the device's memory (CUDA: the GPU's total; CPU: the host's RAM shared by the ranks) times
`gpu_memory_utilization`. The engine sizes its KV pool from what is left and caps its max_model_len to it,
so the check asks for the KV of one step's tokens (max_num_tokens) beside the weights and reserves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from m3bench.runtime.config import ModelConfig, QuantMethod
from m3bench.runtime.engine_config import EngineConfig
from m3bench.runtime.errors import InputError
from m3bench.runtime.memory_plan import GIB, DraftShape, MemoryPlan, PlanSettings, WeightFormat, check_fits

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# How the runtime holds a quantized checkpoint with weights_dtype "auto": as stored (the NVFP4 release:
# routed experts NVFP4, its other linear layers MXFP8).
NATIVE_FORMATS = {QuantMethod.MXFP8: WeightFormat.MXFP8, QuantMethod.NVFP4: WeightFormat.NVFP4_EXPERTS}
WEIGHTS_DTYPES = ("auto", "bfloat16")


@dataclass(frozen=True)
class EngineFit:
    """The engine settings the plan reads (a subset of LLM(...)'s arguments, same names)."""

    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_batch_size: int = 64
    max_num_tokens: int = 2048
    tokens_per_block: int = 128
    gpu_memory_utilization: float = 0.9
    cuda_graphs: bool = False
    weights_dtype: str = "auto"  # auto: the checkpoint's format where the runtime runs it natively
    draft_dir: Path | None = None


def resident_format(cfg: ModelConfig, weights_dtype: str) -> WeightFormat:
    """How the runtime holds the checkpoint's weights: natively where it can, else in the model dtype."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise InputError(f"unknown weights_dtype {weights_dtype!r} (choose from {', '.join(WEIGHTS_DTYPES)})")
    if weights_dtype != "auto":
        return WeightFormat.BF16
    return NATIVE_FORMATS.get(cfg.quant, WeightFormat.BF16)


def device_memory_gib(device: str, ranks: int) -> float:
    """Memory one rank may use: the GPU's total, or the host's RAM split over the ranks."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        return torch.cuda.get_device_properties(index).total_memory / GIB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB / ranks


def _draft_shape(draft_dir: Path | None) -> DraftShape | None:
    if draft_dir is None:
        return None
    from m3bench.runtime.speculative.config import EagleConfig

    d = EagleConfig.from_pretrained(draft_dir)
    return DraftShape(d.hidden_size, d.num_heads, d.num_kv_heads, d.head_dim, d.intermediate_size, d.vocab_size)


def engine_settings(cfg: ModelConfig, fit: EngineFit) -> PlanSettings:
    on_gpu = fit.device.startswith("cuda")
    return PlanSettings(
        tp=fit.tensor_parallel_size, weights=resident_format(cfg, fit.weights_dtype),
        dtype_bytes=DTYPE_BYTES.get(fit.dtype, 2), kv_cache_dtype=fit.kv_cache_dtype,
        gpu_memory_gib=device_memory_gib(fit.device, fit.tensor_parallel_size),
        gpu_memory_utilization=fit.gpu_memory_utilization,
        max_model_len=min(cfg.max_position_embeddings, fit.max_num_tokens), max_num_seqs=fit.max_batch_size,
        max_num_tokens=fit.max_num_tokens, page_tokens=fit.tokens_per_block, draft=_draft_shape(fit.draft_dir),
        context_reserve_gib=1.0 if on_gpu else 0.0, cuda_graph_reserve_gib=1.0 if fit.cuda_graphs else 0.0,
        device_name=fit.device)


def fit_of(engine: EngineConfig) -> EngineFit:
    """The plan's view of a resolved EngineConfig."""
    return EngineFit(engine.device, engine.dtype.value, engine.kv_cache_dtype.value, engine.tensor_parallel_size,
                     engine.max_batch_size, engine.max_num_tokens, engine.tokens_per_block,
                     engine.gpu_memory_utilization, bool(engine.cuda_graphs), engine.weights_dtype.value, engine.draft)


def check_config_fits(engine: EngineConfig) -> MemoryPlan | None:
    """The plan for the engine a resolved EngineConfig builds (None without a checkpoint directory)."""
    if engine.model is None:
        return None
    return check_engine_fits(engine.model, fit_of(engine))


def check_engine_fits(model_dir: Path | str, fit: EngineFit) -> MemoryPlan:
    """Parse model_dir's config.json and run the plan; InputError (one line) when it does not fit."""
    cfg = ModelConfig.from_pretrained(Path(model_dir))
    return check_fits(cfg, engine_settings(cfg, fit))
