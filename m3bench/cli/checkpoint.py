"""`m3bench checkpoint`: make tiny random MiniMax-M3 checkpoints and inspect real ones.

    m3bench checkpoint tiny /tmp/tiny --seed 0 --layout v5 --shards 2
    m3bench checkpoint inspect /path/to/checkpoint        # config summary + tensor validation
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.errors import M3BenchError, user_errors

app = typer.Typer(help="Tiny checkpoints for tests, and checkpoint inspection.", no_args_is_help=True)


class LayoutChoice(str, Enum):  # mirrors runtime.tiny.Layout without importing torch at start-up
    M3 = "m3"
    VL = "vl"
    V5 = "v5"
    V5_VL = "v5-vl"


@app.command("tiny")
@user_errors
def tiny(
    dest: Path = typer.Argument(..., help="Directory to write (created if absent)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    layout: LayoutChoice = typer.Option(LayoutChoice.M3, "--layout", help="File naming scheme."),
    shards: int = typer.Option(1, "--shards", min=1, help="Number of safetensors files (>1 adds an index)."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="Also write a matching tiny Eagle3 draft there."),
) -> None:
    """Write a tiny random MiniMax-M3 checkpoint (config, safetensors, tokenizer) to DEST."""
    from m3bench.runtime.tiny import Layout, write_tiny_checkpoint

    if dest.exists() and not dest.is_dir():
        raise M3BenchError(f"{dest} exists and is not a directory")
    out = write_tiny_checkpoint(dest, seed=seed, layout=Layout(layout.value), shards=shards)
    print(out)
    if draft is not None:
        from m3bench.runtime.speculative.tiny_draft import write_tiny_draft

        if draft.exists() and not draft.is_dir():
            raise M3BenchError(f"{draft} exists and is not a directory")
        write_tiny_draft(draft, target_dir=out, seed=seed + 1)
        print(draft)


@app.command("inspect")
@user_errors
def inspect(path: Path = typer.Argument(..., help="Checkpoint directory.")) -> None:
    """Print DIR's config summary and check its tensors against it (exit 2 when they do not match)."""
    from m3bench.runtime.checkpoint import CheckpointReader
    from m3bench.runtime.config import ModelConfig

    if not path.is_dir():
        raise M3BenchError(f"{path} is not a directory")
    cfg = ModelConfig.from_pretrained(path)
    reader = CheckpointReader(path, cfg)
    reader.validate()
    for line in summary_lines(cfg, len(reader.names())):
        print(line, file=sys.stderr)
    print(f"ok: {path}")


def summary_lines(cfg, n_tensors: int) -> list[str]:
    """A few human-readable lines describing a ModelConfig."""
    lines = [f"{cfg.architecture} ({cfg.family.value}), quant {cfg.quant.value}, vl_wrapper {cfg.vl_wrapper}",
             f"layers {cfg.num_layers}, hidden {cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads} "
             f"x {cfg.head_dim} (rotary {cfg.rotary_dim}), vocab {cfg.vocab_size}"]
    if cfg.msa is not None:
        m = cfg.msa
        lines.append(f"MSA layers {list(cfg.sparse_layers)}: block {m.block_size}, top-{m.topk_blocks} blocks, "
                     f"index {m.index_heads} x {m.index_dim}")
    if cfg.moe is not None:
        e = cfg.moe
        lines.append(f"MoE layers {list(cfg.moe_layers)}: {e.num_experts} experts top-{e.top_k}, "
                     f"intermediate {e.intermediate_size}, shared {e.shared_intermediate_size}")
    lines.append(f"tensors {n_tensors} (canonical), eos ids {list(cfg.eos_token_ids)}")
    return lines


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="checkpoint")
