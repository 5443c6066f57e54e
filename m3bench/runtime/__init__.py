"""The m3bench runtime: a paged, continuously batching engine for MiniMax-M3 (and Llama / Qwen).

    from m3bench.runtime import LLM, SamplingParams

`LLM` and `SamplingParams` load lazily, so importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from m3bench.runtime.llm import LLM

        return LLM
    if name == "SamplingParams":
        from m3bench.runtime.sequence import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'm3bench.runtime' has no attribute {name!r}")
