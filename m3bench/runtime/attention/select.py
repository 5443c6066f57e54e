"""Which attention backend a model runs: `attention_backend="auto" | "torch" | "triton"`.

AUTO is Triton on CUDA (graph safe, KV decoded in the kernels) and torch elsewhere; TRITON on a
CPU device runs the kernels under the Triton interpreter (TRITON_INTERPRET=1, tests only).
"""

from __future__ import annotations

from enum import Enum

import torch

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import ConfigError, InputError


class AttentionChoice(Enum):
    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"


def attention_choice(name: str | AttentionChoice) -> AttentionChoice:
    if isinstance(name, AttentionChoice):
        return name
    try:
        return AttentionChoice(name)
    except ValueError:
        raise InputError(f"unknown attention_backend {name!r} (choose from auto, torch, triton)") from None


def resolve(choice: AttentionChoice, device: torch.device) -> AttentionChoice:
    if choice is AttentionChoice.AUTO:
        return AttentionChoice.TRITON if device.type == "cuda" else AttentionChoice.TORCH
    return choice


def make_backend(choice: str | AttentionChoice, device: torch.device | str, cfg: ModelConfig,
                 tokens_per_block: int | None = None):
    """The backend object; with a page size, Triton checks that MSA layers can use it."""
    picked = resolve(attention_choice(choice), torch.device(device))
    if picked is AttentionChoice.TORCH:
        from m3bench.runtime.attention.torch_backend import TorchBackend

        return TorchBackend()
    from m3bench.runtime.attention.triton_backend import TritonBackend

    backend = TritonBackend()
    if tokens_per_block is not None:
        check_backend_layout(backend, cfg, tokens_per_block)
    return backend


def check_backend_layout(backend, cfg: ModelConfig, tokens_per_block: int) -> None:
    """ConfigError (an InputError) when a Triton backend cannot serve the MSA layers at this page size."""
    from m3bench.runtime.attention.triton_backend import TritonBackend, check_msa_layout

    if not isinstance(backend, TritonBackend):
        return
    p = tokens_per_block
    if p < 16 or (p & (p - 1) and p % 64):  # key tiles of min(P, 64) tokens: a power of two dividing P
        raise ConfigError(f"the Triton attention kernels need tokens_per_block a power of two >= 16 or a "
                          f"multiple of 64; got {p}")
    if cfg.msa is not None and cfg.sparse_layers:
        check_msa_layout(cfg.msa, tokens_per_block)
