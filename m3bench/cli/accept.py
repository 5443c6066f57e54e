"""`m3bench accept`: Eagle3 acceptance length on chat-GSM8K, gated by min_al (exit 0 pass, 1 below, 2 bad input).

    m3bench accept                        # smoke: the tiny checkpoint + its shipped distilled draft vs golden
    m3bench accept --model /ckpt/MiniMax-M3 --draft /ckpt/MiniMax-M3-EAGLE3 --draft-len 3 --device cuda
    m3bench accept --model tiny --draft tiny-eagle3 --limit 3 --no-reference --out results
    m3bench accept --model M --draft D --synthetic-acceptance 2.5 --no-reference     # plumbing at a forced AL

The summary JSON goes to stdout (and OUT/acceptance-<run key>.summary.json); the table to stderr;
per-item counters to OUT/acceptance-<run key>.items.jsonl as they finish (a rerun resumes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from m3bench.cli.errors import EXIT_OK, EXIT_REGRESSION, M3BenchError, user_errors

HELP = {
    "model": "Target checkpoint directory. None: smoke run (tiny checkpoint, shipped draft, golden reference).",
    "draft": "Eagle3 draft checkpoint directory (needed with --model).",
    "draft_len": "Draft tokens verified per step (1-15).",
    "draft_kv": "Draft KV layout: separate (own pool, page 32) or shared (one more layer of the target's pool).",
    "limit": "First N questions of a fixed seeded shuffle of GSM8K test.",
    "max_tokens": "Generation budget per question (default 256).",
    "synthetic_acceptance": "Force this mean acceptance length (outputs are then not the model's).",
    "temperature": "0: greedy (default); > 0: rejection sampling.",
    "num_fewshot": "Few-shot chat turns before the question (default 0).",
    "reference": "Reference YAML instead of the shipped references/acceptance_length.yaml.",
    "no_reference": "Measure without a gate (verdict no_reference, exit 0).",
    "out": "Directory of item records and summaries.",
    "junit": "Write the verdict as JUnit XML.",
    "data_dir": "Local data: gsm8k/test.jsonl (or .parquet). Default $M3BENCH_DATA.",
    "model_id": "Model id of the reference file (default: from --model).",
    "quant_algo": "Reference key quant_algo (default: from config.json).",
    "extra_acc_spec": "Reference key extra_acc_spec, e.g. attention_dp.",
}


def register(app: typer.Typer) -> None:
    @app.command("accept")
    def accept(
        model: Optional[Path] = typer.Option(None, "--model", help=HELP["model"]),
        draft: Optional[Path] = typer.Option(None, "--draft", help=HELP["draft"]),
        draft_len: int = typer.Option(3, "--draft-len", help=HELP["draft_len"]),
        draft_kv: str = typer.Option("separate", "--draft-kv", help=HELP["draft_kv"]),
        limit: Optional[int] = typer.Option(None, "--limit", help=HELP["limit"]),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help=HELP["max_tokens"]),
        synthetic_acceptance: Optional[float] = typer.Option(None, "--synthetic-acceptance",
                                                             help=HELP["synthetic_acceptance"]),
        temperature: float = typer.Option(0.0, "--temperature", help=HELP["temperature"]),
        num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help=HELP["num_fewshot"]),
        reference: Optional[Path] = typer.Option(None, "--reference", help=HELP["reference"]),
        no_reference: bool = typer.Option(False, "--no-reference", help=HELP["no_reference"]),
        out: Path = typer.Option(Path("results"), "--out", help=HELP["out"]),
        junit: Optional[Path] = typer.Option(None, "--junit", help=HELP["junit"]),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=HELP["data_dir"]),
        kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (the model dtype), bf16, fp8, nvfp4, hybrid."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda, ... (default: cuda when available)."),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="Default: bfloat16 on cuda, float32 on cpu."),
        model_id: Optional[str] = typer.Option(None, "--model-id", help=HELP["model_id"]),
        quant_algo: Optional[str] = typer.Option(None, "--quant-algo", help=HELP["quant_algo"]),
        extra_acc_spec: Optional[str] = typer.Option(None, "--extra-acc-spec", help=HELP["extra_acc_spec"]),
        seed: int = typer.Option(0, "--seed", help="Seed of the --limit shuffle."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    ) -> None:
        """Eagle3 acceptance rate / length on chat-GSM8K prompts, gated against min_al."""
        raise typer.Exit(_run(dict(locals())))


@user_errors
def _run(o: dict[str, Any]) -> int:
    from m3bench.evals.acceptance import resolve_reference, run_acceptance

    plan = _plan(o)
    resolve_reference(plan)  # exit 2 before the model loads
    summary, paths = run_acceptance(plan, progress=o["progress"])
    print(json.dumps(summary, indent=2, default=str))
    print_table(summary)
    if o["junit"] is not None:
        write_junit(o["junit"], summary)
    return EXIT_REGRESSION if summary["verdict"] == "fail" else EXIT_OK


SMOKE_LIMIT = 16  # chat-GSM8K questions of the smoke run (references/acceptance_length.yaml: m3bench/tiny-m3)


def _smoke(o: dict[str, Any]) -> dict[str, Any]:
    """No --model: the embedded tiny checkpoint and the distilled draft shipped for it, on CPU in fp32."""
    from m3bench.cli.accuracy import TINY_MODEL_ID, ensure_tiny_checkpoint
    from m3bench.runtime.speculative.tiny_draft import shipped_tiny_eagle3

    if o["draft"] is not None:
        raise M3BenchError("--draft needs --model (without both: the smoke run on the tiny checkpoint)")
    return {**o, "model": ensure_tiny_checkpoint(), "draft": shipped_tiny_eagle3(), "model_id": TINY_MODEL_ID,
            "limit": o["limit"] or SMOKE_LIMIT, "device": o["device"] or "cpu", "dtype": o["dtype"] or "float32"}


def _check(o: dict[str, Any]) -> None:
    if o["reference"] is not None and o["no_reference"]:
        raise M3BenchError("--reference and --no-reference exclude each other (gate against FILE, or run ungated)")
    if o["draft"] is None:
        raise M3BenchError("--model needs --draft (the Eagle3 draft directory)")
    if not o["model"].is_dir():
        raise M3BenchError(f"model directory {o['model']} does not exist")
    if not o["draft"].is_dir():
        raise M3BenchError(f"draft directory {o['draft']} does not exist")
    if o["draft_kv"] not in ("separate", "shared"):
        raise M3BenchError(f"--draft-kv must be separate or shared, got {o['draft_kv']!r}")
    if o["limit"] is not None and o["limit"] <= 0 or o["max_tokens"] is not None and o["max_tokens"] <= 0:
        raise M3BenchError("--limit and --max-tokens must be positive")
    if o["temperature"] < 0:
        raise M3BenchError("--temperature must be >= 0")


def _plan(o: dict[str, Any]):
    from m3bench.cli.accuracy import KV_QUANT_ALGO, _quant_algo, resolve_model_id
    from m3bench.evals.acceptance import AcceptPlan, EngineSettings
    from m3bench.evals.protocols.base import Settings
    from m3bench.evals.references import RunSpec

    if o["model"] is None:
        o = _smoke(o)
    _check(o)
    device = o["device"] or _default_device()
    engine = EngineSettings(o["model"], o["draft"], o["draft_len"], o["draft_kv"], o["synthetic_acceptance"],
                            o["temperature"], device, o["dtype"] or ("float32" if device == "cpu" else "bfloat16"),
                            o["kv_cache_dtype"])
    spec = RunSpec(quant_algo=o["quant_algo"] or _quant_algo(o["model"]),
                   kv_cache_quant_algo=KV_QUANT_ALGO.get(o["kv_cache_dtype"].lower()), spec_dec_algo="Eagle3",
                   extra_acc_spec=o["extra_acc_spec"])
    settings = Settings(o["num_fewshot"], o["limit"], o["max_tokens"], o["seed"])
    return AcceptPlan(engine, settings, o["model_id"] or resolve_model_id(str(o["model"])), spec, o["out"],
                      o["data_dir"], o["reference"], not o["no_reference"])


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def print_table(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"acceptance: {s['metadata']['model_id']}" + (" (synthetic)" if s["synthetic"] else ""))
    for col in ("n", "drafts", "accepted / proposed", "acceptance rate", "AL", "min_al", "verdict"):
        table.add_column(col)
    min_al = "-" if s["min_al"] is None else f"{s['min_al']:.3f}"
    table.add_row(str(s["n"]), str(s["drafts"]), f"{s['accepted']} / {s['proposed']}", f"{s['acceptance_rate']:.3f}",
                  f"{s['acceptance_length']:.3f}", min_al, s["verdict"])
    per_pos = Table(title="per position: P(accepted >= k); histogram of accepted per step")
    per_pos.add_column("k")
    per_pos.add_column("rate")
    per_pos.add_column("steps with exactly k accepted")
    for k, n in enumerate(s["histogram"]):
        rate = "-" if k == 0 else f"{s['per_position_rate'][k - 1]:.3f}"
        per_pos.add_row(str(k), rate, str(n))
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
    console.print(table)
    console.print(per_pos)


def write_junit(path: Path, s: dict[str, Any]) -> Path:
    from m3bench.junit import JUnitCase
    from m3bench.junit import write_junit as write_cases

    cls, name = f"m3bench.acceptance.{s['metadata']['model_id']}", "acceptance_length"
    line = f"AL {s['acceptance_length']:.3f}, acceptance rate {s['acceptance_rate']:.3f} on n={s['n']}"
    if s["verdict"] == "fail":
        case = JUnitCase(cls, name, failure=f"{line} < min_al {s['min_al']:.3f}", failure_type="AcceptanceRegression")
    elif s["verdict"] == "no_reference":
        case = JUnitCase(cls, name, skipped=f"{line}; not gated (--no-reference)")
    else:
        case = JUnitCase(cls, name, f"{line} >= min_al {s['min_al']:.3f}")
    return write_cases(path, "m3bench.acceptance", [case])
