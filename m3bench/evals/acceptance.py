"""The acceptance-length probe: Eagle3 acceptance figures on chat-GSM8K prompts, gated by `min_al`.

    summary, paths = run_acceptance(plan)
    summary["acceptance_length"], summary["verdict"]        # "pass" | "fail" | "no_reference"

Prompts are the gsm8k-chat protocol's turns (0-shot by default: the model's own answers to the
questions) rendered with the checkpoint's chat template (without it acceptance collapses,
docs/measurement.md). Decoding is greedy unless a temperature is given. Each request's per-step
(proposed, accepted) counters go to OUT/acceptance-<run key>.items.jsonl as it finishes (a rerun of the
same command resumes); the figures pool every step of every item, exactly as `compute_spec_stats`
defines them; the gate is AL >= min_al of references/acceptance_length.yaml.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from m3bench import __version__
from m3bench.evals.gate import Verdict
from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Item, Settings
from m3bench.evals.references import AcceptanceProtocol, AcceptanceReference, RunSpec, find_acceptance_reference
from m3bench.evals.results import ItemLog, RunPaths, prompt_sha256, run_key, write_summary
from m3bench.evals.runner import load_splits
from m3bench.provenance import git_commit, provenance, weights_fingerprint
from m3bench.runtime.engine_config import EngineConfig
from m3bench.runtime.errors import InputError

TASK = "acceptance"
DEFAULT_MAX_TOKENS = 256
DEFAULT_FEWSHOT = 0


@dataclass(frozen=True)
class AcceptPlan:
    engine: EngineConfig  # resolved; everything in it changes the measured figures, so all of it keys the run
    settings: Settings  # limit / max_tokens / num_fewshot / seed of the gsm8k-chat items
    model_id: str  # the reference file's key
    spec: RunSpec
    out_dir: Path
    data_dir: Path | None = None
    reference_file: Path | None = None
    use_reference: bool = True
    temperature: float = 0.0  # 0: greedy; > 0: rejection sampling


def resolve_reference(plan: AcceptPlan) -> AcceptanceReference | None:
    """Looked up before any compute: a missing or malformed reference is exit 2."""
    if not plan.use_reference:
        return None
    protocol = AcceptanceProtocol(get_protocol(Task.GSM8K_CHAT).name, plan.engine.draft_len)
    return find_acceptance_reference(plan.model_id, plan.spec, protocol, plan.reference_file)


def build_items(plan: AcceptPlan) -> tuple[list[Item], dict]:
    protocol = get_protocol(Task.GSM8K_CHAT)
    settings = plan.settings
    if settings.num_fewshot is None:
        settings = Settings(DEFAULT_FEWSHOT, settings.limit, settings.max_tokens, settings.seed)
    if settings.max_tokens is None:
        settings = Settings(settings.num_fewshot, settings.limit, DEFAULT_MAX_TOKENS, settings.seed)
    splits = load_splits(protocol, settings, plan.data_dir)
    ctx = {"splits": splits, "settings": settings, "protocol": protocol, "weights": weights(plan.engine)}
    return protocol.build_items(splits, settings), ctx


def weights(engine: EngineConfig) -> dict[str, Any]:
    """Fingerprints of the target's and the draft's weights (they key the run)."""
    return {"target": weights_fingerprint(Path(engine.model)),
            "draft": None if engine.draft is None else weights_fingerprint(Path(engine.draft))}


def identity(plan: AcceptPlan, ctx: dict) -> dict[str, Any]:
    e = plan.engine
    w = ctx["weights"]
    return {"task": TASK, "model": plan.model_id, "protocol_version": ctx["protocol"].version,
            "weights_sha256": {k: None if v is None else v["sha256"] for k, v in w.items()},
            "settings": asdict(ctx["settings"]), "data": {k: s.source.sha256 for k, s in ctx["splits"].items()},
            "engine": {**e.to_dict(), "model": str(Path(e.model).resolve()), "temperature": plan.temperature,
                       "draft": None if e.draft is None else str(Path(e.draft).resolve())}}


def run_acceptance(plan: AcceptPlan, progress: bool = True) -> tuple[dict[str, Any], RunPaths]:
    reference = resolve_reference(plan)
    items, ctx = build_items(plan)
    key = run_key(identity(plan, ctx))
    paths = RunPaths.of(plan.out_dir, TASK, key)
    log = ItemLog(paths.items, key)
    done = log.load()
    todo = [item for item in items if item.id not in done]
    if todo:
        with _progress(progress, len(items), len(items) - len(todo)) as advance:
            def on_record(record: dict[str, Any]) -> None:
                done[record["id"]] = log.append(record)
                advance()

            generate_items(plan, key, todo, on_record)
    summary = build_summary(plan, ctx, [done[i.id] for i in items], reference, key, paths)
    write_summary(paths.summary, summary)
    return summary, paths


def generate_items(plan: AcceptPlan, key: str, items: list[Item], on_record: Callable) -> None:
    """All requests at once through the engine; each item recorded as soon as its request finishes."""
    llm, engine = make_llm(plan.engine), plan.engine
    from m3bench.runtime import SamplingParams

    live: dict[int, Item] = {}
    for item in items:
        r = item.requests[0]
        ids = llm.apply_chat_template(list(r.messages), **dict(r.chat_template_kwargs))
        params = SamplingParams(max_tokens=r.max_tokens, temperature=plan.temperature)
        live[llm.add_request(ids, params)] = item
    texts: dict[int, list[str]] = {rid: [] for rid in live}
    counts: dict[int, int] = {rid: 0 for rid in live}
    while live:
        for d in llm.step():
            if d.request_id not in live:
                continue
            texts[d.request_id].append(d.text)
            counts[d.request_id] += len(d.token_ids)
            if d.finished:
                item = live.pop(d.request_id)
                record = llm.spec_record(d.request_id)
                steps = list(record.steps) if record is not None else []
                on_record(item_record(key, item, "".join(texts.pop(d.request_id)), d.finish_reason,
                                      counts.pop(d.request_id), steps, engine.synthetic_acceptance is not None))


def make_llm(engine: EngineConfig):
    from m3bench.runtime.llm import LLM

    if engine.draft is None:
        raise InputError("the acceptance probe needs --draft (an Eagle3 checkpoint)")
    llm = LLM.from_config(engine)
    if llm.tokenizer is None:
        raise InputError(f"{engine.model} has no tokenizer: the chat-GSM8K prompts need its chat template")
    return llm


def item_record(key: str, item: Item, text: str, finish_reason: str | None, n_out: int,
                steps: list[tuple[int, int]], synthetic: bool) -> dict[str, Any]:
    return {"id": item.id, "run_key": key, "prompt_sha256": prompt_sha256(item), "text": text,
            "finish_reason": finish_reason, "num_output_tokens": n_out, "steps": [list(s) for s in steps],
            "synthetic": synthetic}


def pooled_stats(records: list[dict[str, Any]], draft_len: int, synthetic: bool):
    """The run's SpecStats over every verify step of every item."""
    from m3bench.runtime.speculative.stats import AcceptanceRecord, compute_spec_stats

    recs = [AcceptanceRecord([tuple(s) for s in r["steps"]]) for r in records]
    return compute_spec_stats(recs, draft_len, synthetic)


def verdict_of(al: float, reference: AcceptanceReference | None) -> Verdict:
    if reference is None:
        return Verdict.NO_REFERENCE
    return Verdict.PASS if al >= reference.min_al else Verdict.FAIL


def build_summary(plan: AcceptPlan, ctx: dict, records: list[dict[str, Any]], reference, key: str,
                  paths: RunPaths) -> dict[str, Any]:
    stats = pooled_stats(records, plan.engine.draft_len, plan.engine.synthetic_acceptance is not None)
    return {
        "task": TASK, "protocol": ctx["protocol"].name, "protocol_version": ctx["protocol"].version,
        "n": len(records), **stats.to_dict(),
        "output_tokens": sum(r["num_output_tokens"] for r in records),
        "cap_hit": sum(r["finish_reason"] == "length" for r in records),
        "reference": None if reference is None else reference.to_dict(),
        "min_al": None if reference is None else reference.min_al,
        "verdict": verdict_of(stats.acceptance_length, reference).value,
        "run_key": key, "items_path": str(paths.items),
        "metadata": {"m3bench_version": __version__, "git_commit": git_commit(Path(__file__).parent),
                     "model_id": plan.model_id, "spec": asdict(plan.spec),
                     "engine": identity(plan, ctx)["engine"], "settings": asdict(ctx["settings"]),
                     "data": {k: s.source.to_dict() for k, s in ctx["splits"].items()},
                     "provenance": provenance(str(plan.engine.device), identity(plan, ctx)["engine"], None,
                                              {k: s.source.sha256 for k, s in ctx["splits"].items()},
                                              {"limit_shuffle": ctx["settings"].seed, "engine": plan.engine.seed},
                                              ctx["weights"])},
    }


def _progress(enabled: bool, total: int, done: int):
    import contextlib

    from m3bench.evals.progress import item_progress

    return item_progress(TASK, total, done) if enabled else contextlib.nullcontext(lambda: None)
