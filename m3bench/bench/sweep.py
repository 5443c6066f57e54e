"""The Pareto sweep: for each TP, engine up once; for each (ISL, OSL) and concurrency, warm up, run, record.

    cfg = SweepConfig(out_dir=Path("out"), engine=EngineConfig(Path("ckpt")), tps=(1,), concurrencies=(1, 4),
                      lengths=((1024, 256),))
    rows = run_sweep(cfg)                         # one aggregated row per point, written as it finishes

Each point runs `num_prompts` (default 10 x concurrency) requests after `warmup` (default
2 x concurrency) uncounted ones, all sent at once behind the concurrency cap, ignore_eos.
Repeats of a point use the same prompts; their spread ((max - min) / median) is what the
regression gate must see exceeded. A point whose file already exists with the same settings is
not run again (resume).

With a trace (`cfg.trace`, bench/trace.py) a point replays the trace's window instead: its ISL /
OSL are the window's mean lengths, requests longer than the context are skipped and counted, each
repeat gets fresh block tokens (no cache carried over), and the row gains the prefix-cache hit
rate reached against the one possible (bench/trace_replay.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

import numpy as np

from m3bench.bench.client import EngineTarget, LoadResult, OpenAITarget, measure_client_overhead, run_load
from m3bench.bench.metrics import EmptySampleError, compute_host_timing, compute_metrics
from m3bench.bench.child_process import start_child, stop_child
from m3bench.bench.records import EngineCounters, PrefixCounters, Slo, SpecCounters, write_records
from m3bench.numbers import is_number
from m3bench.strict_json import dumps_strict
from m3bench.bench.sweep_checks import check_lengths, probe_server
from m3bench.bench.engine_options import serve_args
from m3bench.bench.trace import TraceSchedule, TraceSpec
from m3bench.bench.trace_replay import TracePlan, plan_trace_point, window_lengths
from m3bench.bench.workload import (DatasetKind, LengthRange, WorkloadPrompt, dataset_prompts, random_prompts)
from m3bench.runtime.engine_config import EngineConfig, resolve
from m3bench.runtime.errors import InputError

X_KEY = "interactivity_x90"
Y_KEY = "total_tok_per_s_per_gpu"
GATED = (Y_KEY, X_KEY)
KEY_FIELDS = ("tp", "concurrency", "isl", "osl")
SERVER_START_TIMEOUT_S = 600.0


class TargetKind(str, Enum):
    INPROCESS = "inprocess"  # the bundled engine in this process (no HTTP)
    SERVE = "serve"  # `m3bench serve` started by the sweep
    EXTERNAL = "external"  # any OpenAI-compatible server at --base-url


@dataclass(frozen=True)
class SweepConfig:
    out_dir: Path
    engine: EngineConfig | None  # None for an external server (its tensor_parallel_size: replaced by each of tps)
    tps: tuple[int, ...] = (1,)
    concurrencies: tuple[int, ...] = (1,)
    lengths: tuple[tuple[int, int], ...] = ((1024, 256),)
    num_prompts: int | None = None  # None: 10 x concurrency
    warmup: int | None = None  # None: 2 x concurrency
    length_range: LengthRange = LengthRange()
    dataset: DatasetKind = DatasetKind.RANDOM
    dataset_path: Path | None = None
    target: TargetKind = TargetKind.INPROCESS
    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None
    tokenizer: str | None = None  # default: the model directory
    repeats: int = 1
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    slo: Slo | None = None
    trace: TraceSpec | None = None  # --dataset trace:FILE (its window, scale and schedule)

    def check(self) -> None:
        """Refuse what cannot run, before anything starts."""
        if self.target is TargetKind.EXTERNAL and not self.base_url:
            raise InputError("an external target needs --base-url")
        if self.target is not TargetKind.EXTERNAL and self.engine is None:
            raise InputError("the bundled engine needs --model")
        if min(self.tps, default=0) < 1:
            raise InputError(f"TP sizes must be >= 1, got {list(self.tps)}")
        if self.repeats < 1 or min(self.concurrencies, default=0) < 1 or not self.lengths:
            raise InputError("need repeats >= 1, concurrencies >= 1 and at least one (isl, osl)")
        if self.engine is None and self.tokenizer is None:
            raise InputError("an external server needs --tokenizer DIR (or --model DIR) to build prompts")
        if self.trace is not None:
            self._check_trace()

    def _check_trace(self) -> None:
        self.trace.check()  # a bad file: InputError naming the line
        if self.num_prompts is not None:
            raise InputError("a trace replays its window: set its size with --max-requests, not --num-prompts")
        if self.trace.schedule is TraceSchedule.TIMESTAMPS and not math.isinf(self.request_rate):
            raise InputError("--schedule timestamps sends at the trace's times: drop --request-rate")

    def counts(self, concurrency: int) -> tuple[int, int]:
        """(warm-up, measured) request counts of a point."""
        warm = 2 * concurrency if self.warmup is None else self.warmup
        return warm, 10 * concurrency if self.num_prompts is None else self.num_prompts


@dataclass(frozen=True)
class PointKey:
    tp: int
    concurrency: int
    isl: int
    osl: int
    repeat: int = 0

    @property
    def name(self) -> str:
        return f"tp{self.tp}_c{self.concurrency}_isl{self.isl}_osl{self.osl}_r{self.repeat}"


# ---- the loop ---------------------------------------------------------------------------------


def run_sweep(cfg: SweepConfig, on_point: Callable[[dict], None] | None = None) -> list[dict]:
    """Run (or resume) every point; return one row per (tp, concurrency, isl, osl), repeats aggregated."""
    cfg.check()
    return aggregate(asyncio.run(_sweep(cfg, on_point or (lambda row: None))))


async def _sweep(cfg: SweepConfig, on_point: Callable[[dict], None]) -> list[dict]:
    runs = []
    for tp in cfg.tps:
        done = {k: _load_done(cfg, k) for k in _keys(cfg, tp)}
        runs += [row for row in done.values() if row is not None]
        todo = [k for k, row in done.items() if row is None]
        if not todo:
            continue
        check_memory_plan(cfg, tp)
        async with open_target(cfg, tp) as (target, tokenizer, scrape):
            for key in todo:
                row = await run_point(cfg, key, target, tokenizer, scrape)
                runs.append(row)
                on_point(row)
    return runs


def engine_for(cfg: SweepConfig, tp: int) -> EngineConfig:
    """The resolved engine settings of the points at this TP (CUDA graphs and overlap default per TP)."""
    return resolve(replace(cfg.engine, tensor_parallel_size=tp))


def check_engines(engine: EngineConfig, tps: Sequence[int]) -> None:
    """InputError when any TP size's engine cannot run on this machine (before any point starts)."""
    for tp in tps:
        resolve(replace(engine, tensor_parallel_size=tp))


def _keys(cfg: SweepConfig, tp: int) -> list[PointKey]:
    lengths = cfg.lengths if cfg.trace is None else (window_lengths(cfg.trace),)
    return [PointKey(tp, c, isl, osl, r) for isl, osl in lengths for c in cfg.concurrencies
            for r in range(cfg.repeats)]


def check_memory_plan(cfg: SweepConfig, tp: int) -> None:
    """The memory plan (runtime/fit_check.py) of this TP's engine, before it starts (also for --serve): InputError
    when weights and one step do not fit, or when the KV room it leaves cannot hold the workload's longest
    request (a trace replay skips and counts those instead)."""
    if cfg.engine is None:
        return
    from m3bench.runtime.fit_check import check_config_fits

    plan = check_config_fits(engine_for(cfg, tp))
    if plan is None or cfg.trace is not None:
        return
    longest = max(cfg.length_range.bounds(i)[1] + cfg.length_range.bounds(o)[1] for i, o in cfg.lengths)
    if plan.kv_tokens < longest:
        raise InputError(f"TP{tp}: a request of up to {longest} tokens does not fit the KV room the memory plan "
                         f"leaves ({plan.kv_tokens} tokens): {plan.message()}")


async def run_point(cfg: SweepConfig, key: PointKey, target: Any, tokenizer: Any, scrape: Callable) -> dict:
    """Warm up, run the measured requests, write records and figures; return the point's row."""
    n_warm, n_run = cfg.counts(key.concurrency)
    plan = await _trace_plan(cfg, key, target, tokenizer, n_warm) if cfg.trace is not None else None
    warm = list(plan.warmup) if plan else make_prompts(cfg, tokenizer, key, n_warm, salt=1) if n_warm else []
    prompts = list(plan.prompts) if plan else make_prompts(cfg, tokenizer, key, n_run, salt=0)
    if warm:
        await run_load(target, warm, key.concurrency)
    before, clock = await scrape(), target.step_clock
    mark = clock.mark() if clock is not None else None
    result = await run_load(target, prompts, key.concurrency, cfg.request_rate, cfg.burstiness, cfg.seed,
                            arrivals_s=plan.arrivals_s if plan else None)
    counters = _counters_window(before, await scrape())
    steps = clock.since(mark) if clock is not None else None
    floor = await measure_client_overhead(key.concurrency, output_len=max(2, min(key.osl, 64)))
    row = point_row(cfg, key, result, counters.spec, floor, counters.prefix)
    row.update(host_timing_row(steps, result.duration_s))
    row["num_wrong_output_len"] = sum(r.ok and r.output_tokens != p.output_len for r, p in zip(result.records, prompts))
    row.update(_prompt_len_check(result, prompts, target))
    if plan is not None:
        row.update(plan.figures(counters.page_tokens))
    _save(cfg, key, result, row)
    return row


async def _trace_plan(cfg: SweepConfig, key: PointKey, target: Any, tokenizer: Any, n_warm: int) -> TracePlan:
    """The point's trace requests (skipping those the target's context cannot hold), fresh tokens per repeat."""
    context = await target.max_model_len() if hasattr(target, "max_model_len") else None
    salt = key.concurrency * 1009 + key.repeat
    return plan_trace_point(cfg.trace, tokenizer, context, n_warm, cfg.seed, salt,
                            with_text=bool(getattr(target, "send_text", False)))


def _prompt_len_check(result: LoadResult, prompts: Sequence[WorkloadPrompt], target: Any) -> dict:
    """How prompts went (token ids or text) and, by the target's usage counts, how many arrived at another length."""
    off = [r.prompt_tokens - p.prompt_len for r, p in zip(result.records, prompts) if r.ok]
    return {"prompt_as": "text" if getattr(target, "send_text", False) else "token_ids",
            "num_wrong_prompt_len": sum(d != 0 for d in off), "prompt_len_mismatch_tokens": sum(off)}


def make_prompts(cfg: SweepConfig, tokenizer: Any, key: PointKey, num: int, salt: int) -> list[WorkloadPrompt]:
    """The point's prompts: the same for every repeat, different between warm-up and measured."""
    seed = cfg.seed * 1_000_003 + key.isl * 7919 + key.osl * 104729 + key.concurrency * 31 + salt
    if cfg.dataset is DatasetKind.RANDOM:
        return random_prompts(tokenizer, key.isl, key.osl, num, cfg.length_range, seed=seed)
    return dataset_prompts(tokenizer, cfg.dataset, key.osl, num, cfg.dataset_path, seed=seed)


def _counters_window(before: EngineCounters, after: EngineCounters) -> EngineCounters:
    """Counters of the measured window: spec None when the target does not speculate, prefix None when
    it exports no prefix-cache counters."""
    spec = None
    if before.spec is not None and after.spec is not None and after.spec.drafts != before.spec.drafts:
        spec = after.spec.minus(before.spec)
    prefix = None if before.prefix is None or after.prefix is None else after.prefix.minus(before.prefix)
    return EngineCounters(spec, prefix, after.page_tokens)


def point_row(cfg: SweepConfig, key: PointKey, result: LoadResult, spec: SpecCounters | None,
              floor: LoadResult, prefix: PrefixCounters | None = None) -> dict:
    row = {**asdict(key), "name": key.name, "fingerprint": fingerprint(cfg, key)}
    try:
        m = compute_metrics(result.records, result.duration_s, key.tp, cfg.slo, spec, prefix)
        row.update(m.to_flat_dict())
    except EmptySampleError as e:
        row.update(error=str(e), num_requests=len(result.records),
                   num_failed=sum(not r.ok for r in result.records))
    row["synthetic"] = _synthetic(cfg)
    row["client_us_per_chunk"] = result.client_us_per_chunk
    row["client_floor_itl_ms"] = compute_metrics(floor.records, floor.duration_s).itl_ms.mean
    row["first_error"] = next((r.error for r in result.records if r.error), None)
    return row


HOST_KEYS = ("engine_steps", "host_ms_per_step_median", "host_ms_per_step_p90", "device_idle_share")


def host_timing_row(steps: list | None, window_s: float) -> dict:
    """The point's host time per engine step and device idle share (bench/metrics.py); None values when the
    target is not in this process (a server's steps are not seen) or ran no step."""
    if not steps or window_s <= 0:
        return dict.fromkeys(HOST_KEYS)
    return asdict(compute_host_timing(steps, window_s))


def _synthetic(cfg: SweepConfig) -> bool | None:
    """Acceptance forced (--synthetic-acceptance): AL is the asked one, outputs are not the model's.
    None for an external server (not known)."""
    if cfg.engine is None:
        return None
    return cfg.engine.draft is not None and cfg.engine.synthetic_acceptance is not None


def fingerprint(cfg: SweepConfig, key: PointKey) -> str:
    """Hash of every setting that shapes a point's numbers (resume reruns a point whose settings changed)."""
    parts = [asdict(key), cfg.counts(key.concurrency), asdict(cfg.length_range), cfg.dataset.value,
             str(cfg.dataset_path), cfg.target.value, cfg.base_url, cfg.served_model,
             engine_for(cfg, key.tp).to_dict() if cfg.engine else None, cfg.request_rate, cfg.burstiness, cfg.seed,
             asdict(cfg.slo) if cfg.slo else None]
    if cfg.trace is not None:  # (absent otherwise: fingerprints of other workloads stay what they were)
        parts += [asdict(cfg.trace), cfg.trace.digest()]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _point_path(cfg: SweepConfig, key: PointKey) -> Path:
    return Path(cfg.out_dir) / "points" / f"{key.name}.json"


def _save(cfg: SweepConfig, key: PointKey, result: LoadResult, row: dict) -> None:
    path = _point_path(cfg, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(path.with_suffix(".records.jsonl"), result.records)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(dumps_strict(row, indent=1, default=_json_default))
    os.replace(tmp, path)  # a point is done only once its whole file is there


def _load_done(cfg: SweepConfig, key: PointKey) -> dict | None:
    path = _point_path(cfg, key)
    if not path.is_file():
        return None
    try:
        row = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # cut short or damaged: measure the point again
        print(f"m3bench: {path} is not valid JSON ({e}): measuring {key.name} again", file=sys.stderr)
        return None
    if not isinstance(row, dict) or any(k not in row for k in KEY_FIELDS):
        print(f"m3bench: {path} is not a sweep point: measuring {key.name} again", file=sys.stderr)
        return None
    same = row.get("fingerprint") == fingerprint(cfg, key)
    return row if same and "error" not in row else None  # failed or stale points run again


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


# ---- targets ------------------------------------------------------------------------------------


@asynccontextmanager
async def open_target(cfg: SweepConfig, tp: int = 1) -> AsyncIterator[tuple[Any, Any, Callable]]:
    """(target, tokenizer, scrape spec counters) for one TP, engine or server up for its duration."""
    if cfg.target is TargetKind.INPROCESS:
        async with _inprocess(cfg, tp) as opened:
            yield opened
    elif cfg.target is TargetKind.SERVE:
        async with _served(cfg, tp) as opened:
            yield opened
    else:
        target = OpenAITarget(cfg.base_url, cfg.served_model, cfg.api_key)
        try:
            tokenizer = _tokenizer(cfg.tokenizer)
            if cfg.trace is not None:  # token ids where the server takes them, else text (lengths then checked)
                probe = tokenizer.encode("Hi", add_special_tokens=False)[:1] or [0]
                target.send_text = not await target.accepts_token_ids(probe)
            yield target, tokenizer, lambda: scrape_metrics(cfg.base_url, cfg.api_key)
        finally:
            await target.close()


@asynccontextmanager
async def _inprocess(cfg: SweepConfig, tp: int):
    from m3bench.runtime.async_llm import AsyncLLM

    from m3bench.runtime.llm import LLM

    llm = LLM.from_config(engine_for(cfg, tp))  # TP > 1: worker processes until shutdown
    try:
        check_lengths(cfg, llm.max_model_len)
    except InputError:
        llm.shutdown()
        raise
    engine = AsyncLLM(llm)
    scrape = engine_scraper(engine)
    try:
        tokenizer = _tokenizer(cfg.tokenizer) if cfg.tokenizer else llm.tokenizer
        if tokenizer is None:  # prompts are drawn from a tokenizer's ids (any tokenizer: its vocab may be smaller)
            raise InputError(f"{cfg.engine.model} has no tokenizer to draw prompts from: pass --tokenizer DIR")
        yield EngineTarget(engine), tokenizer, scrape
    finally:
        engine.shutdown()
        llm.shutdown()  # stops tensor-parallel workers before the next TP size starts


def engine_scraper(engine: Any) -> Callable:
    """`await scrape()` -> the in-process engine's running counters (AsyncLLM.stats) as EngineCounters."""

    async def scrape() -> EngineCounters:
        s = await engine.stats()
        return EngineCounters(SpecCounters(s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens,
                                           s.spec_accepted_per_pos),
                              PrefixCounters(s.prefix_queried_tokens, s.prefix_hit_tokens), s.page_tokens)

    return scrape


@asynccontextmanager
async def _served(cfg: SweepConfig, tp: int):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = start_server(engine_for(cfg, tp), port, cfg.api_key)
    target = OpenAITarget(base_url, "m3bench-sweep", cfg.api_key, token_ids_ext=True)
    try:
        await wait_healthy(base_url, proc)
        check_lengths(cfg, probe_server(base_url, cfg.api_key))
        yield target, _tokenizer(cfg.tokenizer or str(cfg.engine.model)), lambda: scrape_metrics(base_url, cfg.api_key)
    finally:
        await target.close()
        stop_server(proc)


def _tokenizer(path: str | None) -> Any:
    if path is None:
        raise InputError("no tokenizer: pass --tokenizer DIR")
    from m3bench.runtime.tokenizer import load_hf_tokenizer

    try:
        return load_hf_tokenizer(path)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a tokenizer from {path}: {e}") from e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(opts: EngineConfig, port: int, api_key: str | None) -> subprocess.Popen:
    """`m3bench serve` on 127.0.0.1:port as a child process (its stderr goes to ours)."""
    cmd = [sys.executable, "-m", "m3bench", "serve", *serve_args(opts), "--port", str(port),
           "--served-model-name", "m3bench-sweep"]
    env = dict(os.environ, **({"M3BENCH_API_KEY": api_key} if api_key else {}))
    return start_child(cmd, env)  # dies with the sweep (own process group, parent-death signal)


async def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise InputError(f"m3bench serve exited with code {proc.returncode} before it was healthy")
            try:
                async with session.get(f"{base_url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise InputError(f"m3bench serve was not healthy after {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    stop_child(proc)


_SPEC_RE = re.compile(r'^(?:m3bench|vllm):spec_decode_num_(drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)'
                      r'(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)\s*$')
_POSITION_RE = re.compile(r'position="(\d+)"')
_PREFIX_RE = re.compile(r'^(?:m3bench|vllm):(gpu_)?prefix_cache_(queries|hits)(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$')
_BLOCK_SIZE_RE = re.compile(r'^(?:m3bench|vllm):cache_config_info\{[^}]*block_size="(\d+)"')


def parse_engine_counters(text: str) -> EngineCounters:
    """Speculation and prefix-cache counters (tokens) and the KV page size (`cache_config_info`'s block_size)
    from Prometheus text, `m3bench:` or `vllm:` names (vLLM's deprecated `gpu_prefix_cache_*` only when the
    current names are absent: servers export both); each None when absent."""
    found: dict[tuple[str, str], float] = {}
    page = None
    for line in text.splitlines():
        if (m := _PREFIX_RE.match(line.strip())) is not None:
            key = (m.group(1) or "", m.group(2))
            found[key] = found.get(key, 0) + float(m.group(3))
        elif (b := _BLOCK_SIZE_RE.match(line.strip())) is not None:
            page = int(b.group(1)) or None
    old = "" if ("", "queries") in found else "gpu_"
    prefix = (PrefixCounters(int(found[(old, "queries")]), int(found.get((old, "hits"), 0)))
              if (old, "queries") in found else None)
    return EngineCounters(parse_spec_counters(text), prefix, page)


def parse_spec_counters(text: str) -> SpecCounters | None:
    """Speculative counters from Prometheus text (`m3bench:` or `vllm:` names); None when absent."""
    found: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _SPEC_RE.match(line.strip())
        if m is None:
            continue
        kind, value = m.group(1), float(m.group(3))
        pos = (_POSITION_RE.search(m.group(2) or "") or [None, None])[1]
        if kind == "accepted_tokens_per_pos" and pos is not None:
            per_pos[int(pos)] = per_pos.get(int(pos), 0) + value
        elif kind != "accepted_tokens_per_pos":
            found[kind] = found.get(kind, 0) + value  # summed over label sets (engines, models)
    if "drafts" not in found:
        return None
    pos = tuple(int(per_pos.get(k, 0)) for k in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(int(found["drafts"]), int(found.get("draft_tokens", 0)), int(found.get("accepted_tokens", 0)), pos)


async def scrape_metrics(base_url: str, api_key: str | None) -> EngineCounters:
    """GET /metrics and read its counters (every field None when the server has no such route)."""
    import aiohttp

    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{root}/metrics", headers=headers) as resp:
                return parse_engine_counters(await resp.text()) if resp.status == 200 else EngineCounters()
    except aiohttp.ClientError:
        return EngineCounters()


# ---- repeats, baseline, gate -----------------------------------------------------------------


def aggregate(runs: Sequence[dict]) -> list[dict]:
    """One row per point: the median over repeats of every number, plus `<metric>_spread_pct` of the gated two."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(tuple(r[k] for k in KEY_FIELDS), []).append(r)
    return [_merge(rows) for _, rows in sorted(groups.items())]


def _merge(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]
    out = {k: rows[0][k] for k in KEY_FIELDS}
    out.update(repeats=len(rows), failed_repeats=len(rows) - len(ok))
    if not ok:
        out["error"] = rows[0]["error"]
        return out
    for k, v in ok[0].items():
        if k in out or k in ("repeat", "name", "fingerprint"):
            continue
        values = [r.get(k) for r in ok]
        out[k] = _median(values) if all(is_number(x) for x in values) else v
    for k in GATED:
        values = [r[k] for r in ok]
        out[f"{k}_spread_pct"] = 100.0 * (max(values) - min(values)) / float(np.median(values))
    return out


def _median(values: list) -> float | int:
    med = float(np.median(values))
    return int(med) if all(isinstance(x, int) for x in values) and med.is_integer() else med


@dataclass(frozen=True)
class Change:
    key: tuple[int, int, int, int]
    metric: str
    baseline: float
    current: float
    change_pct: float
    spread_pct: float  # the larger of the two runs' repeat spreads at this point
    regression: bool


def compare(current: Sequence[dict], baseline: Sequence[dict], max_regression_pct: float | None) -> list[Change]:
    """Throughput per GPU and x90 at every point both runs measured; a regression falls by more than
    `max_regression_pct` and by more than the run-to-run spread."""
    base = {tuple(r[k] for k in KEY_FIELDS): r for r in baseline if "error" not in r}
    out = []
    for row in current:
        key = tuple(row[k] for k in KEY_FIELDS)
        if key not in base or "error" in row:
            continue
        for metric in GATED:
            if not (is_number(base[key].get(metric)) and is_number(row.get(metric))):
                continue  # written as null (not finite): nothing to compare
            old, new = float(base[key][metric]), float(row[metric])
            change = 100.0 * (new - old) / old
            spread = max(float(row.get(f"{metric}_spread_pct", 0.0)), float(base[key].get(f"{metric}_spread_pct", 0.0)))
            worse = max_regression_pct is not None and -change > max_regression_pct and -change > spread
            out.append(Change(key, metric, old, new, change, spread, worse))
    return out


def load_results(path: Path) -> list[dict]:
    """The aggregated points of a previous sweep (its results.json, or the directory holding it)."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    if not path.is_file():
        raise InputError(f"--baseline: no results at {path}")
    try:
        return list(json.loads(path.read_text(encoding="utf-8"))["points"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise InputError(f"--baseline {path}: not a sweep results.json ({e})") from e


def write_results(out_dir: Path, rows: Sequence[dict], frontier_rows: Sequence[dict], changes: Sequence[Change],
                  config: dict) -> tuple[Path, Path]:
    """results.json (config, points, frontier, changes) and results.csv (one row per point)."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"config": config, "points": list(rows),
           "frontier": [{k: r[k] for k in KEY_FIELDS} for r in frontier_rows],
           "changes": [asdict(c) for c in changes]}
    (out_dir / "results.json").write_text(dumps_strict(doc, indent=1, default=_json_default))
    df = pd.DataFrame(list(rows))
    df["on_frontier"] = [any(all(r[k] == f[k] for k in KEY_FIELDS) for f in frontier_rows) for r in rows]
    df.to_csv(out_dir / "results.csv", index=False)
    return out_dir / "results.json", out_dir / "results.csv"


def config_summary(cfg: SweepConfig) -> dict:
    d = asdict(replace(cfg, api_key="***" if cfg.api_key else None, engine=None))
    d["engine"] = cfg.engine.to_dict() if cfg.engine else None
    return json.loads(json.dumps(d, default=str))
