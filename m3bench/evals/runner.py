"""One accuracy run: load data -> build requests -> skip done -> backend -> score -> summary -> gate.

    summary, paths = run_task(plan, backend)
    summary["verdict"]   # "pass" | "fail" | "no_reference"
"""

from __future__ import annotations

import contextlib
import random
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from m3bench import __version__
from m3bench.evals.backends.base import Backend, GenResult, ScoreResult
from m3bench.evals.datasets import DataUnavailable, Split, load_split
from m3bench.evals.gate import Verdict
from m3bench.evals.paired import Baseline, find_baseline, pair_records, paired_test
from m3bench.evals.progress import item_progress
from m3bench.evals.sequential import Sprt, boundaries
from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Item, Protocol, RequestKind, Settings
from m3bench.evals.protocols.gsm8k import LM_EVAL_FEWSHOT_SEED
from m3bench.evals.references import AccuracyReference, RunSpec, find_accuracy_reference
from m3bench.evals.results import (
    ItemLog, RunPaths, item_record, ordered_records, prompt_sha256, run_key, score_records, write_summary,
)
from m3bench.provenance import git_commit, provenance, weights_fingerprint
from m3bench.runtime.errors import InputError

IDENTITY_BACKEND_KEYS = ("model", "dtype", "kv_cache_dtype", "draft", "draft_len", "base_url", "chat_template_kwargs")


@dataclass(frozen=True)
class RunPlan:
    task: Task
    settings: Settings
    model_id: str  # the reference files' key
    model_path: str
    model_config_sha256: str | None
    spec: RunSpec
    out_dir: Path
    data_dir: Path | None = None
    reference_file: Path | None = None
    use_reference: bool = True
    baseline: Path | None = None  # an earlier run's summary (or results dir): the paired test gates this run
    sequential_batch: int | None = None  # --sequential: SPRT after every this many items (None: fixed sample)


def run_task(plan: RunPlan, backend: Backend, progress: bool = True,
             splits: dict[str, Split] | None = None) -> tuple[dict[str, Any], RunPaths]:
    """`splits`: load_splits' result when the caller already read the data (None: read it here)."""
    protocol = get_protocol(plan.task)
    reference = resolve_reference(plan, protocol)  # before any compute: a missing reference is exit 2
    splits = load_splits(protocol, plan.settings, plan.data_dir) if splits is None else splits
    items = protocol.build_items(splits, plan.settings)
    baseline = resolve_baseline(plan, protocol, items)  # before any compute: different items are exit 2
    weights = model_weights(plan)
    key = run_key(identity(plan, protocol, backend, splits, weights))
    paths = RunPaths.of(plan.out_dir, plan.task.value, key)
    log = ItemLog(paths.items, key)
    done = log.load()
    todo = [item for item in items if item.id not in done]
    stopped: dict[str, Any] = {}
    with _progress(progress, plan.task.value, len(items), len(items) - len(todo)) as advance:

        def on_record(record: dict[str, Any]) -> None:
            done[record["id"]] = log.append(record)
            advance()

        if plan.sequential_batch is None:
            execute(protocol, backend, key, todo, on_record)
        else:
            items, stopped = run_sequential(plan, protocol, backend, key, items, done, on_record, reference)
    records = ordered_records(items, done)
    summary = build_summary(plan, protocol, backend, splits, score_records(protocol, records), reference, key, paths)
    summary["metadata"]["provenance"] = run_provenance(plan, backend, splits, weights)
    summary = {**summary, **(paired_verdict(protocol, records, baseline) if baseline else stopped)}
    write_summary(paths.summary, summary)
    return summary, paths


def execute(protocol: Protocol, backend: Backend, key: str, items: Sequence[Item], on_record: Callable) -> None:
    """Hand every request over at once; judge and record an item as soon as all its outputs are in."""
    flat = [(i, j) for i, item in enumerate(items) for j in range(len(item.requests))]
    pending: dict[int, list] = {i: [None] * len(item.requests) for i, item in enumerate(items)}
    lock = threading.Lock()

    def on_done(index: int, result: GenResult | ScoreResult) -> None:
        i, j = flat[index]
        with lock:
            pending[i][j] = result
            if any(o is None for o in pending[i]):
                return
            outputs = pending.pop(i)
            on_record(item_record(key, protocol.version, items[i], raw_output(outputs), protocol.judge(items[i], outputs)))

    if not flat:
        return
    requests = [items[i].requests[j] for i, j in flat]
    (backend.score if protocol.kind is RequestKind.SCORE else backend.generate)(requests, on_done)
    if pending:
        raise RuntimeError(f"backend {backend.name} returned no result for {len(pending)} of {len(items)} items")


def run_sequential(plan: RunPlan, protocol: Protocol, backend: Backend, key: str, items: list[Item],
                   done: dict[str, dict[str, Any]], on_record: Callable, reference: AccuracyReference | None
                   ) -> tuple[list[Item], dict[str, Any]]:
    """Items in a seeded shuffle, one batch at a time, until the SPRT decides (or the items run out):
    (the items run, the summary keys of the sequential verdict)."""
    if reference is None:
        raise InputError("--sequential needs a reference gate (not with --no-reference or --baseline)")
    gate = reference.gate(len(items))
    sprt = Sprt.for_gate(gate)
    order = random.Random(f"sequential/{plan.settings.seed}").sample(items, len(items))
    for n in boundaries(len(order), plan.sequential_batch):
        execute(protocol, backend, key, [i for i in order[:n] if i.id not in done], on_record)
        successes = sum(done[i.id]["value"] for i in order[:n])
        verdict = sprt.decide(successes, n)
        if verdict is not None or n == len(order):
            break
    decided = verdict is not None
    verdict = verdict or gate.verdict(100.0 * successes / n)  # no bound crossed: the fixed-sample gate
    info = {"stopped_at": n, "n_max": len(order), "batch": plan.sequential_batch, "llr": sprt.llr(successes, n),
            "decided_by": "sprt" if decided else "fixed_gate", **sprt.to_dict()}
    return order[:n], {"sequential": info, "verdict": verdict.value, "threshold": gate.threshold, "theta": gate.theta}


def raw_output(outputs: Sequence[GenResult] | Sequence[ScoreResult]) -> Any:
    if isinstance(outputs[0], ScoreResult):
        return [{"logprob": o.logprob, "is_greedy": o.is_greedy} for o in outputs]
    o = outputs[0]
    return {"text": o.text, "finish_reason": o.finish_reason, "num_output_tokens": o.num_output_tokens, "spec": o.spec}


def resolve_reference(plan: RunPlan, protocol: Protocol) -> AccuracyReference | None:
    if not plan.use_reference:
        return None
    return find_accuracy_reference(protocol.dataset.value, plan.model_id, plan.spec,
                                   protocol.measured_with(plan.settings), plan.reference_file)


def resolve_baseline(plan: RunPlan, protocol: Protocol, items: Sequence[Item]) -> Baseline | None:
    """The baseline run of this task, checked to hold every item of this run, asked the same way."""
    if plan.baseline is None:
        return None
    settings = {**asdict(plan.settings), **protocol.describe(plan.settings)}
    baseline = find_baseline(plan.baseline, plan.task.value, protocol.version, settings)
    pair_records([{"id": i.id, "prompt_sha256": prompt_sha256(i)} for i in items], baseline.records)
    return baseline


def paired_verdict(protocol: Protocol, records: list[dict[str, Any]], baseline: Baseline) -> dict[str, Any]:
    """Summary keys of the paired test against the baseline (McNemar's exact test), which is the gate."""
    paired = paired_test(records, baseline.records, protocol.metrics[0])
    return {"baseline": baseline.describe(), "paired": paired.to_dict(), "verdict": paired.verdict.value,
            "gate_can_fail": paired.can_fail}


def load_splits(protocol: Protocol, settings: Settings, data_dir: Path | None) -> dict[str, Split]:
    """The test split and, for k-shot, the few-shot split; a missing few-shot split is an InputError."""
    splits = {"test": load_split(protocol.dataset, "test", data_dir)}
    if protocol.fewshot_split not in protocol.splits_needed(settings):
        return splits
    try:
        splits[protocol.fewshot_split] = load_split(protocol.dataset, protocol.fewshot_split, data_dir)
    except DataUnavailable as e:
        k = protocol.fewshot(settings)
        raise InputError(f"{k}-shot {protocol.name} needs the {protocol.fewshot_split} split: {e}. "
                         f"Pass --data-dir with {protocol.dataset.value}/{protocol.fewshot_split}.jsonl "
                         f"or --num-fewshot 0") from e
    return splits


def model_weights(plan: RunPlan) -> dict[str, Any] | None:
    """Fingerprint of the checkpoint directory the run loads (None for a served model name)."""
    path = Path(plan.model_path)
    return weights_fingerprint(path) if path.is_dir() else None


def identity(plan: RunPlan, protocol: Protocol, backend: Backend, splits: dict[str, Split],
             weights: dict[str, Any] | None = None) -> dict[str, Any]:
    described = backend.describe()
    return {
        "model": plan.model_id, "model_path": plan.model_path, "config_sha256": plan.model_config_sha256,
        "weights_sha256": None if weights is None else weights["sha256"],
        "task": plan.task.value, **protocol.describe(plan.settings), "settings": asdict(plan.settings),
        "backend": backend.name, "backend_settings": {k: described.get(k) for k in IDENTITY_BACKEND_KEYS},
        "data": {name: split.source.sha256 for name, split in splits.items()},
    }


def build_summary(plan, protocol, backend, splits, scores, reference, key, paths) -> dict[str, Any]:
    gate = reference.gate(scores["n"]) if reference else None
    verdict = gate.verdict(scores["score"]) if gate else Verdict.NO_REFERENCE
    return {
        "task": plan.task.value, "protocol": protocol.name, "protocol_version": protocol.version, **scores,
        "reference": reference.to_dict() if reference else None,
        "threshold": gate.threshold if gate else None, "theta": gate.theta if gate else None,
        "ceiling": gate.ceiling if gate else None, "gate_can_fail": gate.can_fail if gate else None,
        "verdict": verdict.value, "run_key": key, "items_path": str(paths.items),
        "metadata": metadata(plan, protocol, backend, splits),
    }


def metadata(plan: RunPlan, protocol: Protocol, backend: Backend, splits: dict[str, Split]) -> dict[str, Any]:
    described = backend.describe()
    return {
        "m3bench_version": __version__, "git_commit": git_commit(Path(__file__).parent),
        "model_id": plan.model_id, "model_path": plan.model_path, "model_config_sha256": plan.model_config_sha256,
        "backend": {"name": backend.name, **described}, "spec": asdict(plan.spec),
        "settings": {**asdict(plan.settings), **protocol.describe(plan.settings)},
        "data": {name: split.source.to_dict() for name, split in splits.items()},
        "devices": described.get("devices"),
        "seeds": {"limit_shuffle": plan.settings.seed, "gsm8k_fewshot": LM_EVAL_FEWSHOT_SEED},
    }


def run_provenance(plan: RunPlan, backend: Backend, splits: dict[str, Split],
                   weights: dict[str, Any] | None) -> dict[str, Any]:
    described = backend.describe()
    model_dir = Path(plan.model_path) if Path(plan.model_path).is_dir() else None
    seeds = {"limit_shuffle": plan.settings.seed, "gsm8k_fewshot": LM_EVAL_FEWSHOT_SEED,
             "sequential_order": plan.settings.seed if plan.sequential_batch is not None else None}
    return provenance(described.get("device"), {"backend": backend.name, **described}, model_dir,
                      {name: split.source.sha256 for name, split in splits.items()}, seeds, weights)


def _progress(enabled: bool, label: str, total: int, done: int):
    return item_progress(label, total, done) if enabled else contextlib.nullcontext(lambda: None)
