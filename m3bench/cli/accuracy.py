"""`m3bench accuracy`: MMLU / GSM8K against a reference gate (exit 0 pass, 1 below threshold, 2 bad input).

    m3bench accuracy                                   # smoke run: tiny checkpoint vs its golden reference
    m3bench accuracy --model /ckpt/MiniMax-M3 --task mmlu-gen,gsm8k --device cuda --dtype bfloat16
    m3bench accuracy --backend openai --base-url http://localhost:8000 --model nvidia/MiniMax-M3-NVFP4 \\
        --quant-algo NVFP4 --task gsm8k --limit 200 --junit results/accuracy.xml

Per-item records go to OUT/<task>-<run key>.items.jsonl as they finish (a rerun resumes), the summary to
OUT/<task>-<run key>.summary.json, whose path is printed on stdout; the table goes to stderr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import EXIT_OK, EXIT_REGRESSION, M3BenchError, user_errors
from m3bench.cli.out_lock import out_lock

SMOKE_MODEL_ID = "m3bench/tiny-m3-skill"  # the shipped trained tiny checkpoint (runtime/tiny_skill.py): smoke runs
KV_QUANT_ALGO = {"fp8": "FP8", "nvfp4": "NVFP4", "hybrid": "HYBRID"}  # others: not quantized (None)
QUANT_ALGO = {"nvfp4": "NVFP4", "mxfp8": "MXFP8"}

HELP = {
    "model": "Checkpoint dir (runtime, hf) or served model name (openai). None: smoke run on the tiny checkpoint.",
    "task": "Comma list of mmlu (loglikelihood), mmlu-gen (TensorRT-LLM generative), gsm8k, gsm8k-chat (default mmlu; "
            "the smoke run without --model: mmlu and gsm8k 0-shot, mmlu-gen 5-shot).",
    "limit": "First N of a fixed seeded shuffle (stratified by subject for MMLU; ceil(N/57) per subject for mmlu-gen).",
    "num_fewshot": "Few-shot examples (default: the protocol's: mmlu 0, others 5).",
    "backend": "runtime (m3bench's engine), openai (a server at --base-url), hf (transformers).",
    "base_url": "OpenAI-compatible server (openai backend).",
    "reference": "Reference YAML instead of the shipped references/<task>.yaml.",
    "no_reference": "Measure without a gate (verdict no_reference, exit 0).",
    "out": "Directory of item records and summaries.",
    "data_dir": "Local data: mmlu/{test,dev}.jsonl, gsm8k/{test,train}.jsonl (or .parquet). Default $M3BENCH_DATA.",
    "junit": "Write the verdicts as JUnit XML.",
    "max_tokens": "Generation budget (default: mmlu-gen 2, gsm8k 256, gsm8k-chat 8192).",
    "model_id": "Model id of the reference files (default: from --model).",
    "quant_algo": "Reference key quant_algo (default: from config.json).",
    "extra_acc_spec": "Reference key extra_acc_spec, e.g. attention_dp.",
    "seed": "Seed of the --limit shuffle.",
    "progress": "Progress bar on stderr.",
    "sequential": "Stop as soon as the verdict can no longer change (Wald's SPRT at the gate's alpha, beta and "
                  "theta, checked after every --sequential-batch items of a seeded shuffle); the stopping n is recorded.",
    "sequential_batch": "Items between two looks of --sequential.",
    "baseline": "An earlier run (its summary JSON, or its --out directory) on the same items: gate by a paired "
                "test (McNemar's exact test) against it instead of a reference.",
}


class BackendKind(str, Enum):
    RUNTIME = "runtime"
    OPENAI = "openai"
    HF = "hf"


@dataclass(frozen=True)
class SmokeTask:
    task: str
    limit: int
    num_fewshot: int
    max_tokens: int | None


# held-out splits of the shipped task set (evals/synthetic.py, regenerated into the cache): under a minute on 2 cores.
# mmlu and gsm8k 0-shot measure the skill the model was trained for; mmlu-gen is TensorRT-LLM's 5-shot protocol
# (50 items per subject of the 4: --limit counts per 57 subjects), out of the model's 0-shot training, which makes
# its golden sensitive to the few-shot block, the sampler and positions (tests/evals/test_smoke_faults.py).
SMOKE_TASKS = (SmokeTask("mmlu", 200, 0, None), SmokeTask("gsm8k", 50, 0, 96), SmokeTask("mmlu-gen", 57 * 50, 5, 2))
SMOKE_LIMIT = 57  # items of a smoke-run task with no golden settings


@dataclass(frozen=True)
class Options:
    model: str | None
    tasks: tuple[str, ...] | None  # None: mmlu (the smoke run: SMOKE_TASKS)
    limit: int | None
    num_fewshot: int | None
    backend: BackendKind
    base_url: str | None
    reference: Path | None
    no_reference: bool
    out: Path
    data_dir: Path | None
    junit: Path | None
    max_tokens: int | None
    model_id: str | None
    quant_algo: str | None
    extra_acc_spec: str | None
    seed: int
    progress: bool
    engine: EngineFlags = ENGINE  # --kv-cache-dtype is also the reference key kv_cache_quant_algo, --draft spec_dec_algo
    baseline: Path | None = None
    sequential: bool = False
    sequential_batch: int = 50


def register(app: typer.Typer) -> None:
    @app.command("accuracy")
    @engine_flags
    def accuracy(
        model: Optional[str] = typer.Option(None, "--model", help=HELP["model"]),
        task: Optional[str] = typer.Option(None, "--task", help=HELP["task"]),
        limit: Optional[int] = typer.Option(None, "--limit", help=HELP["limit"]),
        num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help=HELP["num_fewshot"]),
        backend: BackendKind = typer.Option(BackendKind.RUNTIME, "--backend", help=HELP["backend"]),
        base_url: Optional[str] = typer.Option(None, "--base-url", help=HELP["base_url"]),
        reference: Optional[Path] = typer.Option(None, "--reference", help=HELP["reference"]),
        no_reference: bool = typer.Option(False, "--no-reference", help=HELP["no_reference"]),
        out: Path = typer.Option(Path("results"), "--out", help=HELP["out"]),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=HELP["data_dir"]),
        junit: Optional[Path] = typer.Option(None, "--junit", help=HELP["junit"]),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help=HELP["max_tokens"]),
        model_id: Optional[str] = typer.Option(None, "--model-id", help=HELP["model_id"]),
        quant_algo: Optional[str] = typer.Option(None, "--quant-algo", help=HELP["quant_algo"]),
        extra_acc_spec: Optional[str] = typer.Option(None, "--extra-acc-spec", help=HELP["extra_acc_spec"]),
        seed: int = typer.Option(0, "--seed", help=HELP["seed"]),
        progress: bool = typer.Option(True, "--progress/--no-progress", help=HELP["progress"]),
        baseline: Optional[Path] = typer.Option(None, "--baseline", help=HELP["baseline"]),
        sequential: bool = typer.Option(False, "--sequential", help=HELP["sequential"]),
        sequential_batch: int = typer.Option(50, "--sequential-batch", help=HELP["sequential_batch"]),
        engine: EngineFlags = ENGINE,
    ) -> None:
        """Accuracy of a model on MMLU / GSM8K, gated against a reference (TensorRT-LLM's hypothesis test)."""
        tasks = None if task is None else tuple(t.strip() for t in task.split(",") if t.strip())
        if tasks == ():
            raise M3BenchError(f"--task {task!r} names no task (e.g. --task mmlu,gsm8k)")
        if tasks is not None and len(set(tasks)) < len(tasks):
            raise M3BenchError(f"--task {task!r} names a task twice (each task runs once, into one record)")
        opts = Options(model, tasks, limit, num_fewshot, backend, base_url, reference, no_reference, out, data_dir,
                       junit, max_tokens, model_id, quant_algo, extra_acc_spec, seed, progress, engine, baseline,
                       sequential, sequential_batch)
        raise typer.Exit(_run(opts))


@user_errors
def _run(opts: Options) -> int:
    check_options(opts)
    check_gating(opts)
    if opts.backend is not BackendKind.OPENAI:  # bad engine flags: exit 2 before any work
        (opts.engine if opts.model else smoke_engine(opts.engine)).config(None)
    with out_lock(opts.out, "accuracy"):  # one run per --out: a second one refuses (exit 2)
        if opts.model is None:
            return _smoke(opts)
        plans = [_plan(opts, name, opts.limit, opts.num_fewshot, opts.max_tokens) for name in opts.tasks or ("mmlu",)]
        return _run_plans(opts, plans)


def check_options(opts: Options) -> None:
    """Inputs that can be judged before any model loads: paths, counts, contradicting flags."""
    validate.run_paths(opts.out, opts.junit, opts.reference, opts.no_reference, opts.data_dir)
    if opts.max_tokens is not None and opts.max_tokens < 1:
        raise M3BenchError(f"--max-tokens must be >= 1, got {opts.max_tokens}")
    if opts.model is not None and opts.backend is not BackendKind.OPENAI and not Path(opts.model).is_dir():
        raise M3BenchError(f"--model {opts.model} is not a directory (the {opts.backend.value} backend loads a checkpoint)")


def check_gating(opts: Options) -> None:
    """One gate per run: a reference (shipped or --reference), a --baseline, or none (--no-reference)."""
    if opts.baseline is not None and opts.reference is not None:
        raise M3BenchError("--baseline and --reference exclude each other (the baseline's paired test is the gate)")
    if opts.sequential and (opts.no_reference or opts.baseline is not None or opts.sequential_batch < 1):
        raise M3BenchError("--sequential needs a reference gate (not --no-reference or --baseline) and a positive "
                           "--sequential-batch")


def _smoke(opts: Options) -> int:
    """No --model: the shipped trained tiny checkpoint against its golden references, on the held-out splits
    of the task set it was trained on (--data-dir replaces them); no --task: SMOKE_TASKS. --task, --limit,
    --num-fewshot and --max-tokens given are honoured."""
    from m3bench.runtime.tiny_skill import shipped_tiny_skill

    opts = replace(opts, model=str(shipped_tiny_skill()), model_id=SMOKE_MODEL_ID, engine=smoke_engine(opts.engine),
                   data_dir=opts.data_dir or smoke_data_dir())
    smoke = {s.task: s for s in SMOKE_TASKS}
    chosen = SMOKE_TASKS if opts.tasks is None else [smoke.get(t, SmokeTask(t, SMOKE_LIMIT, None, None)) for t in opts.tasks]
    plans = [_plan(opts, s.task, s.limit if opts.limit is None else opts.limit,
                   s.num_fewshot if opts.num_fewshot is None else opts.num_fewshot,
                   s.max_tokens if opts.max_tokens is None else opts.max_tokens) for s in chosen]
    return _run_plans(opts, plans)


def _run_plans(opts: Options, plans: list) -> int:
    from m3bench.evals.protocols import get_protocol
    from m3bench.evals.runner import load_splits, resolve_reference

    if not plans:
        raise M3BenchError("--task names no task")
    data = []  # a missing or malformed reference, or bad data, is exit 2 before the model loads
    for plan in plans:
        resolve_reference(plan, get_protocol(plan.task))
        data.append(load_splits(get_protocol(plan.task), plan.settings, plan.data_dir))
    backend = _backend(opts)
    try:
        summaries = [_run_one(plan, backend, opts, splits) for plan, splits in zip(plans, data)]
    finally:
        backend.close()
    return _finish(opts, summaries, plans[0].model_id)


def _run_one(plan, backend, opts: Options, splits: dict) -> dict[str, Any]:
    from m3bench.evals.runner import run_task

    summary, paths = run_task(plan, backend, progress=opts.progress, splits=splits)
    print(paths.summary, flush=True)
    return summary


def _finish(opts: Options, summaries: list[dict[str, Any]], model_id: str) -> int:
    from m3bench.evals.junit import write_junit

    print_table(summaries, model_id)
    if opts.junit is not None:
        write_junit(opts.junit, summaries, model_id)
    return EXIT_REGRESSION if any(s["verdict"] == "fail" for s in summaries) else EXIT_OK


def _plan(opts: Options, task_name: str, limit, num_fewshot, max_tokens):
    from m3bench.evals.protocols import Task
    from m3bench.evals.protocols.base import Settings
    from m3bench.evals.results import file_sha256
    from m3bench.evals.runner import RunPlan

    try:
        task = Task(task_name)
    except ValueError:
        raise M3BenchError(f"unknown task {task_name!r} (choose from {', '.join(t.value for t in Task)})") from None
    if limit is not None and limit <= 0 or num_fewshot is not None and num_fewshot < 0:
        raise M3BenchError("--limit must be positive and --num-fewshot non-negative")
    model_dir = Path(opts.model) if Path(opts.model).is_dir() else None
    config_sha = file_sha256(model_dir / "config.json") if model_dir else None
    return RunPlan(task, Settings(num_fewshot, limit, max_tokens, opts.seed), opts.model_id or resolve_model_id(opts.model),
                   str(model_dir.resolve()) if model_dir else opts.model, config_sha, run_spec(opts, model_dir),
                   opts.out, opts.data_dir, opts.reference, not opts.no_reference and opts.baseline is None,
                   opts.baseline, opts.sequential_batch if opts.sequential else None)


def resolve_model_id(model: str) -> str:
    """The reference files' key for --model: a served name as is; for a directory, its hub id."""
    path = Path(model)
    if not path.is_dir():
        return model
    for part in reversed(path.resolve().parts):
        if part.startswith("models--"):  # Hugging Face cache: models--org--name/snapshots/<rev>
            return part[len("models--"):].replace("--", "/", 1)
    name = _config(path).get("_name_or_path", "")
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith(("/", ".")):
        return name
    return f"{path.resolve().parent.name}/{path.resolve().name}"


def run_spec(opts: Options, model_dir: Path | None):
    from m3bench.evals.references import RunSpec, extra_acc_spec_of

    quant = opts.quant_algo or (quant_algo_of(model_dir) if model_dir else None)
    extra = extra_acc_spec_of(opts.extra_acc_spec, opts.engine.attention_dp, opts.backend is not BackendKind.OPENAI)
    return RunSpec(quant_algo=quant, kv_cache_quant_algo=KV_QUANT_ALGO.get(opts.engine.kv_cache_dtype.lower()),
                   spec_dec_algo="Eagle3" if opts.engine.draft else None, extra_acc_spec=extra)


def _config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def quant_algo_of(model_dir: Path) -> str | None:
    from m3bench.runtime.config import ModelConfig

    quant = ModelConfig.from_pretrained(model_dir).quant.value
    return QUANT_ALGO.get(quant)


def _backend(opts: Options):
    if opts.backend is BackendKind.RUNTIME:
        from m3bench.evals.backends.runtime import RuntimeBackend

        return RuntimeBackend(engine_config(opts))
    if opts.engine.draft is not None:
        raise M3BenchError(f"--draft applies to the runtime backend; configure speculation on the {opts.backend.value} side")
    if opts.backend is BackendKind.OPENAI:
        from m3bench.evals.backends.openai import OpenAIBackend, OpenAIConfig

        if not opts.base_url:
            raise M3BenchError("--backend openai needs --base-url")
        tokenizer = Path(opts.model) if Path(opts.model).is_dir() else None
        return OpenAIBackend(OpenAIConfig(opts.base_url, None if tokenizer else opts.model, tokenizer=tokenizer))
    from m3bench.evals.backends.hf import DType, HFBackend, HFConfig

    cfg = engine_config(opts)  # the same device and dtype rule as the runtime's
    return HFBackend(HFConfig(Path(opts.model), cfg.device, DType(cfg.dtype.value)))


def engine_config(opts: Options):
    """The resolved EngineConfig of the runtime (and the hf backend's device and dtype)."""
    return opts.engine.config(Path(opts.model))


def smoke_engine(flags: EngineFlags) -> EngineFlags:
    """The smoke runs' golden references were made on CPU in float32: auto means that there."""
    return replace(flags, device="cpu" if flags.device == "auto" else flags.device,
                   dtype="float32" if flags.dtype == "auto" else flags.dtype)


def smoke_data_dir() -> Path:
    """The synthetic task set the shipped tiny model was trained on, regenerated once into the cache."""
    from m3bench.evals.synthetic import cached_task_set
    from m3bench.runtime.tiny_skill import shipped_task_set

    return cached_task_set(shipped_task_set())


def print_table(summaries: list[dict[str, Any]], model_id: str) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=160)  # logs and CI: do not wrap to 80 columns
    console.print(_verdict_table(summaries, model_id))
    for s in summaries:
        if s.get("gate_can_fail") is False:
            console.print(f"[yellow]{unfailable_line(s)}[/yellow]")
        if s.get("paired"):
            console.print(paired_line(s))
        if s.get("sequential"):
            q = s["sequential"]
            console.print(f"{s['task']} sequential: stopped at n={q['stopped_at']} of {q['n_max']} (LLR {q['llr']:.2f}, "
                          f"bounds {q['lower']:.2f} / {q['upper']:.2f}, decided by {q['decided_by']})")
        if s.get("categories"):
            cats = "  ".join(f"{c} {v['score']:.2f} (n={v['n']})" for c, v in s["categories"].items())
            console.print(f"{s['task']} categories: {cats}")


def _verdict_table(summaries: list[dict[str, Any]], model_id: str):
    from rich.table import Table

    from m3bench.evals.scoring import plus_minus

    table = Table(title=f"accuracy: {model_id}")
    for col in ("task", "protocol", "n", "score", "metrics", "reference", "threshold", "theta", "cap hit", "verdict"):
        table.add_column(col)
    for s in summaries:
        ref = s["reference"]
        metrics = ", ".join(f"{k} {v['score']:.2f}" for k, v in s["metrics"].items())
        table.add_row(s["task"], s["protocol"], str(s["n"]), f"{s['score']:.2f} {plus_minus(s['stderr'])}", metrics,
                      _fmt(ref["accuracy"] if ref else None), _bounds(s), _fmt(s["theta"]),
                      str(s["cap_hit"]), s["verdict"])
    return table


def unfailable_line(s: dict[str, Any]) -> str:
    """Why no result of this run's size could have failed its gate (summary's gate_can_fail false)."""
    if s.get("paired"):
        from m3bench.evals.paired import smallest_p_value

        p = s["paired"]
        return (f"{s['task']}: at {p['n']} pairs no result can fail the paired gate (McNemar's smallest p-value there is "
                f"{smallest_p_value(p['n']):.3g}, not below alpha {p['alpha']}): run more items for a verdict that can fail")
    return (f"{s['task']}: at n={s['n']} no score can fail this gate (threshold {s['threshold']:.2f}; the smallest "
            f"regression it detects is {s['theta']:.2f} points): run more items for a verdict that can fail")


def paired_line(s: dict[str, Any]) -> str:
    from m3bench.evals.scoring import plus_minus

    p, b = s["paired"], s["baseline"]
    return (f"{s['task']} vs baseline {b['run_key']} ({b['score']:.2f}): paired difference {p['difference']:+.2f} "
            f"{plus_minus(p['stderr'])}, McNemar {p['metric']} b={p['baseline_only_right']} c={p['current_only_right']} "
            f"p={p['p_value']:.4g} (alpha {p['alpha']}) -> {p['verdict']}")


def _bounds(s: dict[str, Any]) -> str:
    """The threshold, with a golden's ceiling: `floor..ceiling`."""
    ceiling = s.get("ceiling")
    return _fmt(s["threshold"]) if ceiling is None else f"{_fmt(s['threshold'])}..{_fmt(ceiling)}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
