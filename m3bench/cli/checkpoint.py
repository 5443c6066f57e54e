"""`m3bench checkpoint`: make tiny random MiniMax-M3 checkpoints and inspect real ones.

    m3bench checkpoint tiny /tmp/tiny --seed 0 --layout v5 --shards 2
    m3bench checkpoint inspect /path/to/checkpoint        # config summary + tensor validation
    m3bench checkpoint plan --preset minimax-m3 --tp 8     # memory per GPU rank (cli/checkpoint_plan.py)
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.checkpoint_plan import register_plan
from m3bench.cli.errors import M3BenchError, user_errors

app = typer.Typer(help="Tiny checkpoints for tests, and checkpoint inspection.", no_args_is_help=True)


class LayoutChoice(str, Enum):  # mirrors runtime.tiny.Layout without importing torch at start-up
    M3 = "m3"
    VL = "vl"
    V5 = "v5"
    V5_VL = "v5-vl"


class QuantChoice(str, Enum):  # mirrors runtime.tiny_quant.TinyQuant
    NONE = "none"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


@app.command("tiny")
@user_errors
def tiny(
    dest: Path = typer.Argument(..., help="Directory to write (created if absent)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    layout: LayoutChoice = typer.Option(LayoutChoice.M3, "--layout", help="File naming scheme."),
    shards: int = typer.Option(1, "--shards", min=1, help="Number of safetensors files (>1 adds an index)."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="Also write a matching tiny Eagle3 draft there."),
    weights: QuantChoice = typer.Option(QuantChoice.NONE, "--quant", help="Store the linear layers as the "
                                        "MXFP8 / NVFP4 releases do (layouts m3 and vl)."),
) -> None:
    """Write a tiny random MiniMax-M3 checkpoint (config, safetensors, tokenizer) to DEST."""
    from m3bench.runtime.tiny import Layout, write_tiny_checkpoint
    from m3bench.runtime.tiny_quant import TinyQuant

    if dest.exists() and not dest.is_dir():
        raise M3BenchError(f"{dest} exists and is not a directory")
    if weights is not QuantChoice.NONE and layout not in (LayoutChoice.M3, LayoutChoice.VL):
        raise M3BenchError(f"--quant {weights.value} needs --layout m3 or vl")
    out = write_tiny_checkpoint(dest, seed=seed, layout=Layout(layout.value), shards=shards,
                                weights=TinyQuant(weights.value))
    print(out)
    if draft is not None:
        from m3bench.runtime.speculative.tiny_draft import write_tiny_draft

        if draft.exists() and not draft.is_dir():
            raise M3BenchError(f"{draft} exists and is not a directory")
        write_tiny_draft(draft, target_dir=out, seed=seed + 1)
        print(draft)


@app.command("distill-draft")
@user_errors
def distill_draft(
    target: Path = typer.Argument(..., help="Target checkpoint directory (a small model: it runs in fp32)."),
    dest: Path = typer.Argument(..., help="Draft directory to write (config.json, model.safetensors in bf16)."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="jsonl whose --field values become "
                                                "the user turns (default: the tiny training corpus)."),
    field: str = typer.Option("question", "--field", help="Text field of --prompts-file rows."),
    num_prompts: int = typer.Option(1024, "--num-prompts", min=1, help="Prompts (the first N texts of the file)."),
    new_tokens: int = typer.Option(96, "--new-tokens", min=2, help="Greedy continuation length per prompt."),
    steps: int = typer.Option(2000, "--steps", min=1, help="Optimizer steps."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Sequences per step."),
    unroll: int = typer.Option(3, "--unroll", min=1, help="Draft steps trained per position (the draft_len)."),
    hard_labels: bool = typer.Option(False, "--hard-labels", help="Train on the target's tokens, not its logits."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Distil an Eagle3 draft from TARGET's own greedy continuations (for tiny checkpoints: CI references)."""
    import json

    from m3bench.runtime.speculative.distill import DistillConfig, TinyDistill, distill_tiny_draft

    if not target.is_dir():
        raise M3BenchError(f"target directory {target} does not exist")
    texts = None
    if prompts_file is not None:
        texts = _texts(prompts_file, field, num_prompts)
    plan = TinyDistill(num_prompts, new_tokens, not hard_labels, DistillConfig(steps, batch_size, unroll, seed=seed))
    report = distill_tiny_draft(target, dest, plan, device, texts)
    print(json.dumps(report), file=sys.stderr)
    print(dest)


def _texts(path: Path, field: str, n: int) -> list[str]:
    """The `field` text of the first n rows of a JSON-lines file."""
    from m3bench.evals.datasets import parse_jsonl

    from m3bench.cli.validate import text_file

    rows = parse_jsonl(text_file(path, "--prompts-file"), str(path))[:n]
    if not rows:
        raise M3BenchError(f"{path} has no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise M3BenchError(f"{path} row {i + 1} has no text field {field!r}")
    return [row[field] for row in rows]


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


register_plan(app)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="checkpoint")
