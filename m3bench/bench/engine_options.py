"""EngineOptions: how to build the bundled engine, shared by `m3bench serve` and the in-process sweep.

Kept apart from the server so that sweeps import no web framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m3bench.runtime.errors import InputError


@dataclass(frozen=True)
class EngineOptions:
    """How to build the bundled engine (shared by `m3bench serve` and the in-process sweep)."""

    model_dir: str
    load_format: str = "auto"
    device: str = "cpu"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    kv_cache_dtype: str = "auto"
    max_batch_size: int = 64
    max_num_tokens: int = 2048
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    synthetic_acceptance: float | None = None  # forced acceptance length (needs draft_dir)
    tensor_parallel_size: int = 1
    draft_dir: str | None = None  # Eagle3 draft: speculative decoding (load_format dummy: its config.json only)
    draft_len: int = 3
    draft_kv: str = "separate"  # separate | shared
    cuda_graphs: bool = False
    async_scheduling: bool | None = None  # None: the runtime's default (on for CUDA without draft or TP)
    weights_dtype: str = "auto"  # auto: MXFP8 checkpoints natively; bfloat16: dequantized on load

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "dummy"):
            raise InputError(f"--load-format must be auto or dummy, not {self.load_format!r}")
        if self.synthetic_acceptance is not None and self.draft_dir is None:
            raise InputError("--synthetic-acceptance forces the acceptance of draft tokens: it needs --draft DIR")
        if self.draft_kv not in ("separate", "shared"):
            raise InputError(f"--draft-kv must be separate or shared, not {self.draft_kv!r}")
        if self.draft_len < 1:
            raise InputError(f"--draft-len must be >= 1, got {self.draft_len}")

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"

    def build(self) -> Any:
        """The LLM these options describe."""
        from m3bench.runtime import LLM

        self.check_fits()
        return LLM(self.model_dir, device=self.device, dtype=self.resolved_dtype(), kv_cache_dtype=self.kv_cache_dtype,
                   load_format=self.load_format, max_batch_size=self.max_batch_size,
                   max_num_tokens=self.max_num_tokens, num_kv_blocks=self.num_kv_blocks,
                   gpu_memory_utilization=self.gpu_memory_utilization, seed=self.seed,
                   tensor_parallel_size=self.tensor_parallel_size, cuda_graphs=self.cuda_graphs,
                   speculative_model=self.draft_dir, draft_len=self.draft_len, draft_kv=self.draft_kv,
                   synthetic_acceptance_length=self.synthetic_acceptance, async_scheduling=self.async_scheduling,
                   weights_dtype=self.weights_dtype)

    def check_fits(self) -> None:
        """The memory plan (runtime/fit_check.py): InputError with its message when the model does not fit."""
        from m3bench.runtime.fit_check import EngineFit, check_engine_fits

        check_engine_fits(self.model_dir, EngineFit(
            self.device, self.resolved_dtype(), self.kv_cache_dtype, self.tensor_parallel_size,
            self.max_batch_size, self.max_num_tokens, gpu_memory_utilization=self.gpu_memory_utilization,
            cuda_graphs=self.cuda_graphs, weights_dtype=self.weights_dtype,
            draft_dir=None if self.draft_dir is None else Path(self.draft_dir)))

    def cli_args(self) -> list[str]:
        """The same options as `m3bench serve` flags."""
        args = ["--model", self.model_dir, "--load-format", self.load_format, "--device", self.device,
                "--dtype", self.dtype, "--kv-cache-dtype", self.kv_cache_dtype,
                "--max-batch-size", str(self.max_batch_size), "--max-num-tokens", str(self.max_num_tokens),
                "--gpu-memory-utilization", str(self.gpu_memory_utilization), "--seed", str(self.seed)]
        if self.num_kv_blocks is not None:
            args += ["--num-kv-blocks", str(self.num_kv_blocks)]
        if self.draft_dir is not None:
            args += ["--draft", self.draft_dir, "--draft-len", str(self.draft_len), "--draft-kv", self.draft_kv]
        if self.synthetic_acceptance is not None:
            args += ["--synthetic-acceptance", str(self.synthetic_acceptance)]
        if self.cuda_graphs:
            args += ["--cuda-graphs"]
        if self.async_scheduling is not None:
            args += ["--async-scheduling" if self.async_scheduling else "--no-async-scheduling"]
        if self.weights_dtype != "auto":
            args += ["--weights-dtype", self.weights_dtype]
        return args
