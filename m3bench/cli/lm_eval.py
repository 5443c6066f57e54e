"""`m3bench lm-eval`: lm-evaluation-harness tasks on the bundled runtime (the `m3bench` lm-eval model).

    m3bench lm-eval --model DIR --tasks mmlu,gsm8k --limit 50 --num-fewshot 5 --output-path out/
    m3bench lm-eval --model DIR --tasks my_mmlu --include-path tasks/   # local task yamls (offline)

Runs lm-eval's `simple_evaluate` with `M3BenchLM` (m3bench.evals.lm_eval_adapter); the table goes to
stderr, the results JSON to `--output-path/results.json` (or stdout), samples to
`--output-path/samples_<task>.jsonl` with `--log-samples`. Same as
`python -m m3bench.evals.lm_eval_adapter --model m3bench --model_args pretrained=DIR ...`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import M3BenchError, user_errors
from m3bench.runtime.engine_config import EngineConfig


@dataclass(frozen=True)
class LmEvalRun:
    engine: EngineConfig  # its model: the checkpoint directory
    tasks: tuple[str, ...]
    limit: float | None = None
    num_fewshot: int | None = None
    include_path: Path | None = None
    apply_chat_template: bool = False
    log_samples: bool = False
    seed: int = 0


def parse_tasks(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tasks:
        raise M3BenchError("--tasks needs at least one task name")
    return tasks


def check_tasks(task_manager: Any, tasks: tuple[str, ...]) -> None:
    known = set(task_manager.all_tasks) | set(task_manager.all_groups) | set(task_manager.all_tags)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise M3BenchError(f"unknown lm-eval tasks {unknown} (see `lm-eval ls tasks`, or pass --include-path)")


def run_lm_eval(run: LmEvalRun) -> dict[str, Any]:
    """lm-eval's simple_evaluate on the m3bench model; returns lm-eval's results dict."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from m3bench.evals.lm_eval_adapter import M3BenchLM

    if run.include_path is not None and not run.include_path.is_dir():
        raise M3BenchError(f"--include-path is not a directory: {run.include_path}")
    task_manager = TaskManager(include_path=str(run.include_path) if run.include_path else None)
    check_tasks(task_manager, run.tasks)
    model = M3BenchLM(engine_config=run.engine)
    results = lm_eval.simple_evaluate(
        model=model, tasks=list(run.tasks), num_fewshot=run.num_fewshot, limit=_limit(run.limit),
        task_manager=task_manager, log_samples=run.log_samples, apply_chat_template=run.apply_chat_template,
        random_seed=run.seed,
    )
    if results is None:
        raise M3BenchError("lm-eval returned no results")
    return results


def check_numbers(limit: float | None, num_fewshot: int | None) -> None:
    """Counts that lm-eval would only trip over after the model loaded (engine sizes: EngineConfig checks them)."""
    validate.finite(limit, "--limit")
    _limit(limit)
    if num_fewshot is not None and num_fewshot < 0:
        raise M3BenchError(f"--num-fewshot must be >= 0, got {num_fewshot}")


def _limit(limit: float | None) -> int | float | None:
    """lm-eval reads a limit below 1 as a fraction of each task, from 1 on as a count."""
    if limit is not None and limit <= 0:
        raise M3BenchError(f"--limit must be positive, got {limit}")
    if limit is None or limit < 1:
        return limit
    if limit != int(limit):
        raise M3BenchError(f"--limit {limit}: a count must be whole (or a fraction below 1)")
    return int(limit)


def write_outputs(results: dict[str, Any], output_path: Path | None) -> None:
    """Table to stderr; results JSON to output_path/results.json or stdout; samples as jsonl files."""
    from lm_eval.utils import make_table

    print(make_table(results), file=sys.stderr)
    samples = results.pop("samples", None) or {}
    text = json.dumps(results, indent=2, default=str)
    if output_path is None:
        print(text)
        return
    output_path.mkdir(parents=True, exist_ok=True)
    (output_path / "results.json").write_text(text + "\n")
    for task, rows in samples.items():
        with open(output_path / f"samples_{task}.jsonl", "w") as f:
            f.writelines(json.dumps(r, default=str) + "\n" for r in rows)


def register(app: typer.Typer) -> None:
    @app.command("lm-eval")
    @user_errors
    @engine_flags
    def lm_eval_command(
        model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
        tasks: str = typer.Option(..., "--tasks", help="Comma-separated lm-eval tasks or groups, e.g. mmlu,gsm8k."),
        limit: Optional[float] = typer.Option(None, "--limit", help="Items per task (a fraction when < 1)."),
        num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="Few-shot examples (task default)."),
        include_path: Optional[Path] = typer.Option(None, "--include-path", help="Extra lm-eval task yamls."),
        apply_chat_template: bool = typer.Option(False, "--apply-chat-template", help="Chat-format the prompts."),
        log_samples: bool = typer.Option(False, "--log-samples", help="Write per-item samples (needs --output-path)."),
        output_path: Optional[Path] = typer.Option(None, "--output-path", help="Directory for results.json."),
        seed: int = typer.Option(0, "--seed", help="Engine and lm-eval seed."),
        engine: EngineFlags = ENGINE,
    ) -> None:
        """Run lm-evaluation-harness tasks on the bundled runtime (lm-eval model `m3bench`)."""
        cfg = engine.config(model, seed=seed)
        if log_samples and output_path is None:
            raise M3BenchError("--log-samples needs --output-path")
        if not model.is_dir():
            raise M3BenchError(f"model directory not found: {model}")
        check_numbers(limit, num_fewshot)
        if output_path is not None:
            validate.out_directory(output_path, "--output-path")
        run = LmEvalRun(cfg, parse_tasks(tasks), limit, num_fewshot, include_path, apply_chat_template, log_samples,
                        seed)
        write_outputs(run_lm_eval(run), output_path)
