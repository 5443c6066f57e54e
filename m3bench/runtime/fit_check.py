"""The memory plan run before an engine loads: refuse with the plan's message instead of failing mid-load.

    check_config_fits(resolve(EngineConfig(Path("ckpt"), tensor_parallel_size=8)))   # LLM.from_config runs it

The budget is the device's memory (CUDA: the GPU's total; CPU: the host's RAM shared by the ranks) times
`gpu_memory_utilization`. The engine sizes its KV pool from what is left and caps its max_model_len to it,
so the check asks for the KV of one step's tokens (max_num_tokens) beside the weights and reserves.
"""

from __future__ import annotations

import os
from pathlib import Path

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.engine_config import EngineConfig, WeightsDtype, parse_enum
from m3bench.runtime.errors import InputError
from m3bench.runtime.memory_plan import (
    GIB,
    DraftShape,
    MemoryPlan,
    PlanSettings,
    WeightFormat,
    check_fits,
    native_format,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def resident_format(cfg: ModelConfig, weights_dtype: WeightsDtype | str) -> WeightFormat:
    """How the runtime holds the checkpoint's weights: natively where it can (memory_plan.native_format: the NVFP4
    release's routed experts NVFP4, its other linear layers MXFP8), else in the model dtype."""
    if parse_enum(WeightsDtype, weights_dtype, "weights_dtype") is not WeightsDtype.AUTO:
        return WeightFormat.BF16
    return native_format(cfg)


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
    if not Path(draft_dir).is_dir():
        raise InputError(f"draft directory {draft_dir} does not exist")
    from m3bench.runtime.speculative.config import EagleConfig

    d = EagleConfig.from_pretrained(draft_dir)
    return DraftShape(d.hidden_size, d.num_heads, d.num_kv_heads, d.head_dim, d.intermediate_size, d.vocab_size)


def engine_settings(cfg: ModelConfig, engine: EngineConfig) -> PlanSettings:
    """The plan's settings for the engine a resolved EngineConfig builds."""
    on_gpu, tp = engine.on_cuda, engine.tensor_parallel_size
    return PlanSettings(
        tp=tp, weights=resident_format(cfg, engine.weights_dtype), dtype_bytes=DTYPE_BYTES.get(engine.dtype.value, 2),
        kv_cache_dtype=engine.kv_cache_dtype.value, gpu_memory_gib=device_memory_gib(engine.device, tp),
        gpu_memory_utilization=engine.gpu_memory_utilization,
        max_model_len=min(cfg.max_position_embeddings, engine.max_num_tokens), max_num_seqs=engine.max_batch_size,
        max_num_tokens=engine.max_num_tokens, page_tokens=engine.tokens_per_block, draft=_draft_shape(engine.draft),
        context_reserve_gib=1.0 if on_gpu else 0.0, cuda_graph_reserve_gib=1.0 if engine.cuda_graphs else 0.0,
        device_name=engine.device, attention_dp=engine.attention_dp)


def check_config_fits(engine: EngineConfig) -> MemoryPlan | None:
    """Parse the checkpoint's config.json and run the plan for the engine a resolved EngineConfig builds;
    InputError (one line) when it does not fit; None without a checkpoint directory."""
    if engine.model is None:
        return None
    cfg = ModelConfig.from_pretrained(engine.model)
    return check_fits(cfg, engine_settings(cfg, engine))
