"""The engine flags: one option group that every command building an engine takes (same names, defaults, help).

    @engine_flags
    def generate(model: Path = typer.Option(...), ..., engine: EngineFlags = ENGINE) -> None:
        cfg = engine.config(model=model, seed=seed)       # a resolved, validated EngineConfig (exit 2 if not)

`engine_flags` appends the flags below to the command's signature (Typer reads `__signature__`) and hands
the command one `EngineFlags` in its `engine` parameter. `--seed` stays each command's own (its meaning
differs: a shuffle, a workload, a sampling seed); `config(seed=...)` puts it in the EngineConfig.
Imports no torch: `config()` imports it (to look for CUDA) inside the command body.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from m3bench.runtime.engine_config import (
    AttentionBackend,
    DraftKV,
    DType,
    EngineConfig,
    KVCacheDtype,
    LoadFormat,
    WeightsDtype,
)
from m3bench.runtime.errors import InputError

PANEL = "Engine"


def _choice(enum: type[Enum]) -> type[Enum]:
    """A str Enum with the values of a runtime enum (Typer lists its values as the choices)."""
    return Enum(enum.__name__ + "Choice", {m.name: m.value for m in enum}, type=str)  # type: ignore[return-value]


DTypeChoice, KVChoice, LoadFormatChoice = _choice(DType), _choice(KVCacheDtype), _choice(LoadFormat)
DraftKVChoice, AttentionChoice, WeightsDtypeChoice = _choice(DraftKV), _choice(AttentionBackend), _choice(WeightsDtype)

CUDA_GRAPHS_HELP = ("Capture CUDA graphs of the decode step (with --draft: of the verify and draft steps). "
                    "Default: on for CUDA at TP 1.")
ASYNC_HELP = ("Overlap scheduling: schedule step N+1 while step N runs on the device (same outputs). "
              "Default: on for CUDA at TP 1 without --draft; with --draft or at --tp > 1 when asked.")
WEIGHTS_DTYPE_HELP = ("auto: quantized checkpoints run as stored (MXFP8 layers, NVFP4 routed experts); "
                      "bfloat16: dequantize to the model dtype on load.")
ATTENTION_DP_HELP = ("Attention data parallelism (needs --tp N > 1): N engines, each with its own requests and KV "
                     "cache, attention with all heads; the MoE stays expert-parallel (tokens exchanged). Batch, "
                     "token and KV limits are per rank.")
MAX_MODEL_LEN_HELP = ("Context (prompt + output) a request may reach, up to the model's max_position_embeddings "
                      "and the KV pool (default: the most both allow).")


@dataclass(frozen=True)
class Flag:
    name: str  # the EngineFlags field and the command's keyword parameter (= the EngineConfig field, but
    # CONFIG_FIELD's and tp: a list of sizes for the sweep, EngineConfig.tensor_parallel_size elsewhere)
    annotation: Any
    option: Any  # typer.Option(...)


def _opt(default: Any, *names: str, help: str) -> Any:
    return typer.Option(default, *names, help=help, rich_help_panel=PANEL, show_default=True)


FLAGS = (
    Flag("device", str, _opt("auto", "--device", help="auto (cuda when this machine has CUDA, else cpu), cpu, "
                                                      "cuda, cuda:N.")),
    Flag("dtype", DTypeChoice, _opt(DTypeChoice.AUTO, "--dtype", help="Compute dtype (auto: bfloat16 on CUDA, "
                                                                       "float32 on CPU).")),
    Flag("kv_cache_dtype", KVChoice, _opt(KVChoice.AUTO, "--kv-cache-dtype", help="KV cache storage (auto: the "
                                          "model dtype; hybrid: MSA layers nvfp4, dense layers fp8).")),
    Flag("load_format", LoadFormatChoice, _opt(LoadFormatChoice.AUTO, "--load-format",
                                               help="auto: the checkpoint's weights; dummy: random (config.json only).")),
    Flag("tokens_per_block", int, _opt(128, "--tokens-per-block", help="Tokens per KV page (a power of two or a "
                                       "multiple of 64).")),
    Flag("max_batch_size", int, _opt(64, "--max-batch-size", help="Sequences in flight per engine step.")),
    Flag("max_num_tokens", int, _opt(2048, "--max-num-tokens", help="Token budget of one engine step "
                                     "(longer prompts prefill in chunks).")),
    Flag("num_kv_blocks", Optional[int], _opt(None, "--num-kv-blocks", help="KV pages (default: from free GPU "
                                              "memory on CUDA, 16384 tokens on CPU).")),
    Flag("gpu_memory_utilization", float, _opt(0.9, "--gpu-memory-utilization",
                                               help="Share of GPU memory the engine may fill.")),
    Flag("prefix_caching", bool, _opt(True, "--prefix-caching/--no-prefix-caching",
                                      help="Reuse KV pages of shared prompt prefixes.")),
    Flag("cuda_graphs", Optional[bool], _opt(None, "--cuda-graphs/--no-cuda-graphs", help=CUDA_GRAPHS_HELP)),
    Flag("async_scheduling", Optional[bool], _opt(None, "--async-scheduling/--no-async-scheduling",
                                                  help=ASYNC_HELP)),
    Flag("max_model_len", Optional[int], _opt(None, "--max-model-len", help=MAX_MODEL_LEN_HELP)),
    Flag("weights_dtype", WeightsDtypeChoice, _opt(WeightsDtypeChoice.AUTO, "--weights-dtype", help=WEIGHTS_DTYPE_HELP)),
    Flag("attention_backend", AttentionChoice, _opt(AttentionChoice.AUTO, "--attention-backend",
                                                    help="auto: Triton on CUDA, torch on CPU.")),
    Flag("tp", str, _opt("1", "--tp", help="Tensor-parallel size: ranks (GPUs, or CPU processes) of one model "
                         "(sweep: a list such as 1,2,4).")),
    Flag("attention_dp", bool, _opt(False, "--attention-dp/--no-attention-dp", help=ATTENTION_DP_HELP)),
    Flag("draft", Optional[Path], _opt(None, "--draft", help="Eagle3 draft directory: speculative decoding "
                                       "(with --load-format dummy only its config.json is read).")),
    Flag("draft_len", int, _opt(3, "--draft-len", help="Draft tokens proposed per verify step (1-15).")),
    Flag("draft_kv", DraftKVChoice, _opt(DraftKVChoice.SEPARATE, "--draft-kv", help="Draft KV pages: separate "
                                         "(own pool) or shared (the target's pages; keeps prefix caching).")),
    Flag("synthetic_acceptance", Optional[float], _opt(None, "--synthetic-acceptance", help="Force this mean "
                                                       "acceptance length (needs --draft; outputs are then not the "
                                                       "model's).")),
)
FLAG_NAMES = tuple(f.name for f in FLAGS)
CONFIG_FIELD = {"prefix_caching": "enable_prefix_caching"}  # flag -> EngineConfig field where the names differ


@dataclass(frozen=True)
class EngineFlags:
    """The engine flags as given on the command line (choices as their values)."""

    device: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    tokens_per_block: int = 128
    max_batch_size: int = 64
    max_num_tokens: int = 2048
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = True
    cuda_graphs: bool | None = None
    async_scheduling: bool | None = None
    max_model_len: int | None = None
    weights_dtype: str = "auto"
    attention_backend: str = "auto"
    tp: str = "1"
    attention_dp: bool = False
    draft: Path | None = None
    draft_len: int = 3
    draft_kv: str = "separate"
    synthetic_acceptance: float | None = None

    def tp_sizes(self) -> tuple[int, ...]:
        """--tp as a list of sizes ('1,2,4' -> (1, 2, 4))."""
        try:
            sizes = tuple(int(x) for x in self.tp.split(",") if x.strip())
        except ValueError:
            raise InputError(f"--tp: expected a size or a list like 1,2,4, got {self.tp!r}") from None
        if not sizes or min(sizes) < 1:
            raise InputError(f"--tp: sizes must be >= 1, got {self.tp!r}")
        return sizes

    def unresolved(self, model: Path | None, seed: int = 0, tp: int | None = None) -> EngineConfig:
        """The EngineConfig these flags ask for ("auto" left to decide)."""
        if tp is None:
            sizes = self.tp_sizes()
            if len(sizes) != 1:
                raise InputError(f"--tp takes one size here, got {self.tp!r} (`m3bench sweep` sweeps a list)")
            tp = sizes[0]
        if self.draft is not None and not self.draft.is_dir():
            raise InputError(f"draft directory {self.draft} does not exist")
        values = {CONFIG_FIELD.get(f, f): getattr(self, f) for f in FLAG_NAMES if f != "tp"}
        return EngineConfig(model=model, seed=seed, tensor_parallel_size=tp, **values)

    def config(self, model: Path | None, seed: int = 0, tp: int | None = None) -> EngineConfig:
        """The resolved EngineConfig (this machine's device, dtype, graphs and overlap decided)."""
        from m3bench.runtime.engine_config import resolve

        return resolve(self.unresolved(model, seed, tp))


ENGINE = EngineFlags()  # the `engine` parameter's placeholder default (engine_flags replaces it)


def engine_flags(fn: Callable) -> Callable:
    """Give a command the engine option group; it receives the values as `engine: EngineFlags`."""
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "engine"]
    added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.option, annotation=f.annotation)
             for f in FLAGS]
    clash = {p.name for p in own} & set(FLAG_NAMES)
    if clash:
        raise TypeError(f"{fn.__name__} declares engine flags itself: {sorted(clash)}")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: _plain(kwargs.pop(name)) for name in FLAG_NAMES if name in kwargs}
        return fn(*args, engine=EngineFlags(**values), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{p.name: p.annotation for p in own}, **{f.name: f.annotation for f in FLAGS}}
    return wrapper


def _plain(value: Any) -> Any:
    """A Choice enum member -> its value (EngineConfig parses values into the runtime enums)."""
    return value.value if isinstance(value, Enum) else value

