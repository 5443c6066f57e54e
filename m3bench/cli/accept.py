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
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import EXIT_OK, EXIT_REGRESSION, M3BenchError, user_errors
from m3bench.cli.out_lock import out_lock

HELP = {
    "model": "Target checkpoint directory. None: smoke run (tiny checkpoint, shipped draft, golden reference).",
    "limit": "First N questions of a fixed seeded shuffle of GSM8K test.",
    "max_tokens": "Generation budget per question (default 256).",
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
    @engine_flags
    def accept(
        model: Optional[Path] = typer.Option(None, "--model", help=HELP["model"]),
        limit: Optional[int] = typer.Option(None, "--limit", help=HELP["limit"]),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help=HELP["max_tokens"]),
        temperature: float = typer.Option(0.0, "--temperature", help=HELP["temperature"]),
        num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help=HELP["num_fewshot"]),
        reference: Optional[Path] = typer.Option(None, "--reference", help=HELP["reference"]),
        no_reference: bool = typer.Option(False, "--no-reference", help=HELP["no_reference"]),
        out: Path = typer.Option(Path("results"), "--out", help=HELP["out"]),
        junit: Optional[Path] = typer.Option(None, "--junit", help=HELP["junit"]),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=HELP["data_dir"]),
        model_id: Optional[str] = typer.Option(None, "--model-id", help=HELP["model_id"]),
        quant_algo: Optional[str] = typer.Option(None, "--quant-algo", help=HELP["quant_algo"]),
        extra_acc_spec: Optional[str] = typer.Option(None, "--extra-acc-spec", help=HELP["extra_acc_spec"]),
        seed: int = typer.Option(0, "--seed", help="Seed of the --limit shuffle."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
        engine: EngineFlags = ENGINE,
    ) -> None:
        """Eagle3 acceptance rate / length on chat-GSM8K prompts, gated against min_al."""
        raise typer.Exit(_run(dict(locals())))


@user_errors
def _run(o: dict[str, Any]) -> int:
    from m3bench.evals.acceptance import resolve_reference, run_acceptance

    validate.run_paths(o["out"], o["junit"], o["reference"], o["no_reference"], o["data_dir"])
    validate.finite(o["temperature"], "--temperature")  # (--synthetic-acceptance: EngineConfig checks it)
    plan = _plan(o)
    resolve_reference(plan)  # exit 2 before the model loads
    with out_lock(o["out"], "accept"):
        summary, paths = run_acceptance(plan, progress=o["progress"])
    print(json.dumps(summary, indent=2, default=str))
    print_table(summary)
    if o["junit"] is not None:
        write_junit(o["junit"], summary)
    return EXIT_REGRESSION if summary["verdict"] == "fail" else EXIT_OK


SMOKE_LIMIT = 16  # held-out chat-GSM8K questions of the smoke run (acceptance_length.yaml: m3bench/tiny-m3-skill)
SMOKE_MAX_TOKENS = 128


def _smoke(o: dict[str, Any]) -> dict[str, Any]:
    """No --model: the shipped trained tiny checkpoint and its distilled draft, on CPU in fp32, on the held-out
    GSM8K split of the task set they were trained on (--data-dir replaces it)."""
    from m3bench.cli.accuracy import SMOKE_MODEL_ID, smoke_data_dir, smoke_engine
    from m3bench.runtime.tiny_skill import shipped_tiny_skill, shipped_tiny_skill_eagle3

    if o["engine"].draft is not None:
        raise M3BenchError("--draft needs --model (without both: the smoke run on the tiny checkpoint)")
    engine = replace(smoke_engine(o["engine"]), draft=shipped_tiny_skill_eagle3())
    return {**o, "model": shipped_tiny_skill(), "engine": engine, "model_id": SMOKE_MODEL_ID,
            "limit": SMOKE_LIMIT if o["limit"] is None else o["limit"],
            "max_tokens": SMOKE_MAX_TOKENS if o["max_tokens"] is None else o["max_tokens"],
            "data_dir": o["data_dir"] or smoke_data_dir()}


def _check(o: dict[str, Any]) -> None:
    if o["engine"].draft is None:
        raise M3BenchError("--model needs --draft (the Eagle3 draft directory)")
    if not o["model"].is_dir():
        raise M3BenchError(f"model directory {o['model']} does not exist")
    if o["limit"] is not None and o["limit"] <= 0 or o["max_tokens"] is not None and o["max_tokens"] <= 0:
        raise M3BenchError("--limit and --max-tokens must be positive")
    if o["temperature"] < 0:
        raise M3BenchError("--temperature must be >= 0")


def _plan(o: dict[str, Any]):
    from m3bench.cli.accuracy import KV_QUANT_ALGO, quant_algo_of, resolve_model_id
    from m3bench.evals.acceptance import AcceptPlan
    from m3bench.evals.protocols.base import Settings
    from m3bench.evals.references import RunSpec, extra_acc_spec_of

    o["engine"].config(None)  # bad engine flags: exit 2 before any work (the smoke run's checkpoint included)
    if o["model"] is None:
        o = _smoke(o)
    _check(o)
    engine = o["engine"].config(o["model"])
    spec = RunSpec(quant_algo=o["quant_algo"] or quant_algo_of(o["model"]),
                   kv_cache_quant_algo=KV_QUANT_ALGO.get(engine.kv_cache_dtype.value), spec_dec_algo="Eagle3",
                   extra_acc_spec=extra_acc_spec_of(o["extra_acc_spec"], engine.attention_dp))
    settings = Settings(o["num_fewshot"], o["limit"], o["max_tokens"], o["seed"])
    return AcceptPlan(engine, settings, o["model_id"] or resolve_model_id(str(o["model"])), spec, o["out"],
                      o["data_dir"], o["reference"], not o["no_reference"], temperature=o["temperature"])


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
