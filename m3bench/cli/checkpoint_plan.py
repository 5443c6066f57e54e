"""`m3bench checkpoint plan`: does the model fit on a GPU rank? (runtime/memory_plan.py does the sums).

    m3bench checkpoint plan --preset minimax-m3 --tp 8 --weights mxfp8 --kv-cache-dtype fp8
    m3bench checkpoint plan /ckpt/MiniMax-M3-MXFP8 --tp 8 --max-model-len 131072 --json

Exit 0 when weights, reserves and one max-model-len sequence's KV fit; 1 when they do not; 2 on bad input.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.errors import EXIT_REGRESSION, M3BenchError, user_errors
from m3bench.cli.engine_flags import KVChoice


class PresetChoice(str, Enum):
    MINIMAX_M3 = "minimax-m3"


class WeightsChoice(str, Enum):  # mirrors runtime.memory_plan.WeightFormat, plus auto
    AUTO = "auto"  # the checkpoint's own format (quantization_config)
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    NVFP4_EXPERTS = "nvfp4-experts"
    NVFP4_EXPERTS_E4M3 = "nvfp4-experts-e4m3"  # the experts' codes held as e4m3 bytes (M3BENCH_NV_CODES=e4m3)


class DraftChoice(str, Enum):
    NONE = "none"
    MHA = "mha"  # Inferact/MiniMax-M3-EAGLE3: 64 KV heads
    GQA = "gqa"  # the -GQA variant: 4 KV heads


@user_errors
def plan(
    path: Optional[Path] = typer.Argument(None, help="Checkpoint directory (its config.json is read)."),
    preset: Optional[PresetChoice] = typer.Option(None, "--preset", help="A published config instead of DIR."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel ranks (one GPU each)."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Expert-parallel ranks (default: --tp)."),
    attention_dp: bool = typer.Option(False, "--attention-dp", help="Attention DP over the --tp ranks: only the "
                                      "routed experts split; attention, dense layers and KV heads whole."),
    weights: WeightsChoice = typer.Option(WeightsChoice.AUTO, "--weights", help="Weight format in memory (auto: "
                                          "as the runtime holds the checkpoint's, see --weights-dtype)."),
    kv_cache_dtype: KVChoice = typer.Option(KVChoice.AUTO, "--kv-cache-dtype", help="KV cache storage."),
    gpu_memory_gib: Optional[float] = typer.Option(None, "--gpu-memory-gib", help="Memory of one GPU "
                                                   "(default: this machine's GPU, else 141)."),
    utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="Share of it the engine may use."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1,
                                                help="Tokens of one sequence (default: max_position_embeddings)."),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1, help="Sequences decoded at once."),
    max_num_tokens: int = typer.Option(2048, "--max-num-tokens", min=1, help="Tokens of one step."),
    draft: DraftChoice = typer.Option(DraftChoice.NONE, "--eagle3", help="Count an Eagle3 draft layer too."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as one JSON object."),
) -> None:
    """Weight, workspace and KV bytes per GPU rank, tokens and sequences that fit, and a verdict."""
    from m3bench.runtime import memory_plan as mp

    from m3bench.runtime.fit_check import resident_format

    if attention_dp and ep is not None:
        raise M3BenchError("--attention-dp splits the experts over the --tp ranks: leave out --ep")
    cfg = _config(path, preset)
    fmt = resident_format(cfg, "auto") if weights is WeightsChoice.AUTO else mp.weight_format_for(cfg, weights.value)
    settings = mp.PlanSettings(
        tp=tp, ep=ep, weights=fmt, kv_cache_dtype=kv_cache_dtype.value,
        gpu_memory_gib=gpu_memory_gib if gpu_memory_gib is not None else _device_gib(),
        gpu_memory_utilization=utilization, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_tokens=max_num_tokens, draft=_draft(draft), attention_dp=attention_dp)
    result = mp.plan_memory(cfg, settings)
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        for line in plan_lines(result):
            print(line)
    if not result.fits:
        raise typer.Exit(EXIT_REGRESSION)


def _config(path: Path | None, preset: PresetChoice | None):
    from m3bench.runtime.config import ModelConfig
    from m3bench.runtime.memory_plan import preset_config

    if (path is None) == (preset is None):
        raise M3BenchError("give a checkpoint DIR or --preset, not both or neither")
    if preset is not None:
        return preset_config(preset.value)
    if not path.is_dir():
        raise M3BenchError(f"{path} is not a directory")
    return ModelConfig.from_pretrained(path)


def _device_gib() -> float:
    """This machine's first GPU in GiB, else the H200's 141."""
    from m3bench.runtime.memory_plan import DEFAULT_GPU_MEMORY_GIB, GIB

    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    except ImportError:
        pass
    return DEFAULT_GPU_MEMORY_GIB


def _draft(choice: DraftChoice):
    from m3bench.runtime.memory_plan import DraftShape

    return {DraftChoice.NONE: None, DraftChoice.MHA: DraftShape(),
            DraftChoice.GQA: DraftShape(num_kv_heads=4)}[choice]


def plan_lines(p) -> list[str]:
    """The plan as a few aligned lines (GiB = 2^30 bytes)."""
    from m3bench.runtime.memory_plan import GIB

    s = p.settings
    lines = [f"per rank: TP{s.tp} EP{s.ep or s.tp}, weights {s.weights.value}, KV {s.kv_cache_dtype}, "
             f"budget {s.gpu_memory_gib:g} GiB x {s.gpu_memory_utilization:g} = {p.budget_bytes / GIB:.2f} GiB"]
    lines += [f"  {name:<16}{b / GIB:>10.3f} GiB" for name, b in p.parts.items() if b]
    lines += [f"  {'weights':<16}{p.weight_bytes / GIB:>10.3f} GiB",
              f"  {'workspace':<16}{p.workspace_bytes / GIB:>10.3f} GiB",
              f"  {'cuda graphs':<16}{p.cuda_graph_bytes / GIB:>10.3f} GiB",
              f"KV per token: {p.kv_bytes_per_token} B K/V + {p.index_k_bytes_per_token} B index-K; page of "
              f"{s.page_tokens}: {p.page_bytes} B",
              f"KV room: {p.kv_pages} pages = {p.kv_tokens} tokens; sequences of {p.max_model_len} tokens: "
              f"{p.sequences} (max-num-seqs {s.max_num_seqs})"]
    verdict = "fits" if p.fits else f"does not fit by {p.shortfall_bytes / GIB:.2f} GiB"
    lines.append(f"verdict: {verdict}")
    return lines


def register_plan(app: typer.Typer) -> None:
    app.command("plan")(plan)
