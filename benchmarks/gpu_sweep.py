"""Serving sweeps of the bundled engine at MiniMax-M3's per-GPU TP8/EP8 shapes, with and without Eagle3.

    python benchmarks/gpu_sweep.py                      # H200: two sweeps in < 7 min, tables last; files to $OUT
    python benchmarks/gpu_sweep.py --layers 12 --budget-s 390 --out out/
    python benchmarks/gpu_sweep.py --cpu-smoke          # tiny shapes on CPU (what the test runs)
    python benchmarks/gpu_sweep.py --layers 47 --trace ../shared/data/traces/conversation_trace.jsonl \
        --max-requests 64 --concurrency 16 64 --spec-graphs   # replay a trace's first requests instead

Writes into a temp dir (a) the target's config.json at the per-GPU shapes of benchmarks/decode_step.py
(hidden 6144, 8 q heads, 1 KV head of 128, rotary 64, index 1 x 128, 16 experts of 3072 top-4, shared
3072/8, dense layers 0-2 of 12288/8, vocab 200064/8, page 128, top-16 blocks; `--layers` of them)
next to the tiny checkpoint's tokenizer (2048 ids: random prompts draw from those; the dummy model
samples anywhere in its 25008 and the in-process bench never detokenizes), and (b) the config.json of
an MHA Eagle3 draft at per-GPU TP8 shapes (hidden 6144, 8 heads, 8 KV heads of 128, intermediate
18432/8, vocab 200064/8). Weights are random (`load_format=dummy`, draft included). Then two in-process
sweeps through m3bench.bench.sweep: `plain` (CUDA graphs) and `eagle3` (synthetic acceptance 2.8,
draft_len 3, no graphs: speculation has none yet), TP 1, concurrency 1,4,16,64, ISL/OSL 1024/256 (lengths
drawn in [0.8 L, L], InferenceX), FP8 KV, per point max(4, 2 C) measured requests after C warm-up ones
(outside the window; the first point's warm-up also pays Triton's compilation). A point that would start
past its share of `--budget-s` is skipped and recorded as such. Output per sweep: OUT/<sweep>/results.{json,csv}
(points, frontier), frontier.csv, pareto.png, points/*.json; OUT/combined.{json,csv}; the combined table last.

With `--trace FILE` every point replays the trace's first `--max-requests` requests (bench/trace.py: prompts
from hash_ids, trace order behind the cap, `--trace-scale`; C warm-up requests of their shapes) instead of
random ISL/OSL prompts; max_position_embeddings becomes `--max-pos` (default 196608: the traces' longest
prompts), the draft shares the target's KV pages (`draft_kv=shared`: prefix caching stays on with speculation),
and the table adds TTFT p50/p99, E2E-normalized interactivity P90 and the prefix hit rate reached / possible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

from decode_floor import TINY, M3Shapes  # noqa: E402

DRAFT_HEADS, DRAFT_KV_HEADS, DRAFT_HEAD_DIM, DRAFT_INTER = 8, 8, 128, 18432 // 8
PLAIN_SHARE = 0.35  # of --budget-s: the plain sweep's deadline (graphs: it is the fast one)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
SPEC_HOST_MS_PER_REQUEST = 390.0 / 64  # docs/performance.md section 3: tiny model, batch 64, wall ms per step
STEP_MS_47_LAYERS = {1: 17.5, 4: 26.6, 16: 33.5, 64: 36.4}  # docs/performance.md section 2, ctx 1024, graphs


@dataclass(frozen=True)
class Settings:
    shapes: M3Shapes
    layers: int
    device: str
    dtype: str
    kv_cache_dtype: str
    concurrencies: tuple[int, ...]
    isl: int
    osl: int
    synthetic_al: float
    draft_len: int
    budget_s: float
    max_pos: int
    spec_graphs: bool = False  # capture graphs for the eagle3 sweep too (once the engine supports it)
    sweeps: tuple[str, ...] = ("plain", "eagle3")
    trace: str | None = None  # replay this trace's window instead of random prompts
    max_requests: int = 64
    trace_scale: float = 1.0
    max_warmup: int = 0  # > 0: at most this many warm-up requests a point (long trace prompts at high C)


def gpu_settings(args) -> Settings:
    max_pos = args.max_pos or (196608 if args.trace else 4096)
    return Settings(M3Shapes(), args.layers, "cuda", "bfloat16", "fp8", tuple(args.concurrency), 1024, 256,
                    args.synthetic_acceptance, args.draft_len, args.budget_s, max_pos, args.spec_graphs,
                    tuple(args.sweeps), args.trace, args.max_requests, args.trace_scale, args.max_warmup)


def cpu_settings(args) -> Settings:
    """Tiny shapes (vocab 4096, above the 2048-id tokenizer's), page 128 as on the GPU, bf16 KV."""
    shapes = replace(TINY, page=128, vocab=4096)
    return Settings(shapes, 4, "cpu", "float32", "bf16", (1, 2), 32, 8, args.synthetic_acceptance, args.draft_len,
                    args.budget_s, args.max_pos or 512, sweeps=tuple(args.sweeps), trace=args.trace,
                    max_requests=args.max_requests, trace_scale=args.trace_scale)


# ---- model files ------------------------------------------------------------------------------


def write_target(dest: Path, st: Settings) -> Path:
    """config.json at the settings' shapes plus the tiny checkpoint's tokenizer files."""
    from decode_setup import hf_m3_config

    from m3bench.runtime.tiny import write_tiny_checkpoint

    dest.mkdir(parents=True, exist_ok=True)
    cfg = hf_m3_config(st.shapes, st.layers, st.max_pos).to_dict()
    (dest / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
    with tempfile.TemporaryDirectory() as tiny:
        src = write_tiny_checkpoint(Path(tiny) / "tiny", seed=0)
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy(src / name, dest / name)
    return dest


def write_draft(dest: Path, target: Path, st: Settings) -> Path:
    """An MHA Eagle3 draft config.json for the target (GPU: 8 heads, 8 KV heads of 128, 18432/8)."""
    from m3bench.runtime.config import ModelConfig
    from m3bench.runtime.speculative.tiny_draft import tiny_draft_config

    base = tiny_draft_config(ModelConfig.from_pretrained(target))
    if st.device == "cuda":
        cfg = replace(base, num_heads=DRAFT_HEADS, num_kv_heads=DRAFT_KV_HEADS, head_dim=DRAFT_HEAD_DIM,
                      intermediate_size=DRAFT_INTER)
    else:
        cfg = replace(base, num_kv_heads=base.num_heads)  # MHA, as on the GPU
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    return dest


# ---- the sweeps ---------------------------------------------------------------------------------


def counts(concurrency: int, max_warmup: int = 0) -> tuple[int, int]:
    """(warm-up, measured) requests of a point: C (at most max_warmup when set), then max(4, 2 C)."""
    return min(concurrency, max_warmup or concurrency), max(4, 2 * concurrency)


def engine_options(st: Settings, target: Path, draft: Path | None):
    from m3bench.runtime.engine_config import EngineConfig

    spec = {} if draft is None else dict(draft=draft, draft_len=st.draft_len, synthetic_acceptance=st.synthetic_al,
                                         draft_kv="shared" if st.trace else "separate")
    return EngineConfig(target, load_format="dummy", device=st.device, dtype=st.dtype,
                        kv_cache_dtype=st.kv_cache_dtype, max_batch_size=max(st.concurrencies),
                        cuda_graphs=st.device == "cuda" and (draft is None or st.spec_graphs), **spec)


def point_config(base, concurrency: int, max_warmup: int = 0):
    warm, n = counts(concurrency, max_warmup)
    if base.trace is not None:  # a trace replays its whole window
        return replace(base, concurrencies=(concurrency,), warmup=warm)
    return replace(base, concurrencies=(concurrency,), num_prompts=n, warmup=warm)


def point_key(base, st: Settings, concurrency: int):
    from m3bench.bench.sweep import PointKey
    from m3bench.bench.trace_replay import window_lengths

    isl, osl = (st.isl, st.osl) if base is None or base.trace is None else window_lengths(base.trace)
    return PointKey(1, concurrency, isl, osl)


async def run_one_sweep(base, st: Settings, deadline_s: float) -> tuple[list[dict], list[dict]]:
    """(measured rows, skipped rows): one engine for every point, points in order, none started past the deadline."""
    from m3bench.bench.sweep import open_target, run_point

    rows, skipped = [], []
    async with open_target(base, 1) as (target, tokenizer, scrape):
        for c in st.concurrencies:
            key = point_key(base, st, c)
            if time.monotonic() >= deadline_s:
                skipped.append({**asdict(key), "name": key.name, "skipped": True,
                                "error": "skipped: past the --budget-s guard"})
                print(f"  {key.name}: skipped (budget)", file=sys.stderr, flush=True)
                continue
            t0 = time.monotonic()
            try:
                rows.append(await run_point(point_config(base, c, st.max_warmup), key, target, tokenizer, scrape))
            except Exception as e:  # recorded; the next points still run
                traceback.print_exc()
                skipped.append(failed_row(st, c, e))
                continue
            print(f"  {key.name}: {time.monotonic() - t0:.1f} s; {_brief(rows[-1])}", file=sys.stderr, flush=True)
    return rows, skipped


def failed_row(st: Settings, concurrency: int, error: BaseException) -> dict:
    key = point_key(None, st, concurrency)
    return {**asdict(key), "name": key.name, "error": f"failed: {type(error).__name__}: {error}"[:300]}


def _brief(row: dict) -> str:
    if "error" in row:
        return f"FAILED: {row['error']} ({row.get('first_error')})"
    al = row.get("spec_acceptance_length")
    return (f"TPOT p50 {row['tpot_ms_median']:.2f} ms, x90 {row['interactivity_x90']:.1f} tok/s/user, "
            f"{row['total_tok_per_s_per_gpu']:.0f} tok/s/GPU" + ("" if al is None else f", AL {al:.2f}"))


def write_outputs(out_dir: Path, base, rows: list[dict], skipped: list[dict]) -> list[dict]:
    """results.{json,csv} (points incl. skipped, frontier), frontier.csv and pareto.png; the rows."""
    import pandas as pd

    from m3bench.bench.pareto import frontier
    from m3bench.bench.plot import plot_pareto
    from m3bench.bench.sweep import X_KEY, Y_KEY, aggregate, config_summary, write_results

    done = aggregate(rows) if rows else []
    ok = [r for r in done if "error" not in r]
    front = frontier(ok, x=lambda r: r[X_KEY], y=lambda r: r[Y_KEY])
    all_rows = sorted(done + skipped, key=lambda r: r["concurrency"])
    write_results(out_dir, all_rows, front, [], config_summary(base))
    pd.DataFrame(front).to_csv(out_dir / "frontier.csv", index=False)
    if ok:
        plot_pareto(ok, out_dir / "pareto.png", [])
    return all_rows


def run_sweeps(st: Settings, out: Path, work: Path) -> dict[str, list[dict]]:
    from m3bench.bench.sweep import SweepConfig

    start = time.monotonic()
    target = write_target(work / "target", st)
    draft = write_draft(work / "draft", target, st)
    plain_share = PLAIN_SHARE if "eagle3" in st.sweeps else 1.0
    plans = [p for p in (("plain", None, start + plain_share * st.budget_s), ("eagle3", draft, start + st.budget_s))
             if p[0] in st.sweeps]
    results = {}
    for label, draft_dir, deadline in plans:
        base = SweepConfig(out_dir=out / label, engine=engine_options(st, target, draft_dir), lengths=((st.isl, st.osl),),
                           concurrencies=st.concurrencies, seed=0, trace=trace_spec(st))
        print(f"sweep {label}: {json.dumps(base.engine.to_dict())}", file=sys.stderr, flush=True)
        try:
            rows, skipped = asyncio.run(run_one_sweep(base, st, deadline))
        except Exception as e:  # one sweep's failure (engine build, OOM) must not lose the other's figures
            traceback.print_exc()
            rows, skipped = [], [failed_row(st, c, e) for c in st.concurrencies]
        results[label] = write_outputs(out / label, base, rows, skipped)
        release_device(st.device)
    return results


def trace_spec(st: Settings):
    if st.trace is None:
        return None
    from m3bench.bench.trace import TraceSpec

    return TraceSpec(Path(st.trace), 0, st.max_requests, st.trace_scale)


def release_device(device: str) -> None:
    """Free the finished sweep's engine (weights, KV pool, graphs) before the next sizes its pool from free memory."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        free_b, total_b = torch.cuda.mem_get_info()
        print(f"  device memory free after the sweep: {free_b / 2**30:.1f} of {total_b / 2**30:.1f} GiB",
              file=sys.stderr, flush=True)


# ---- estimate and the combined table ------------------------------------------------------------


def step_ms(st: Settings, batch: int, spec: bool) -> float:
    """Rough decode-step time: the measured 47-layer graph step scaled to --layers, plus 1 ms of host time;
    a speculative step (no graphs) as 3x that, plus K draft steps of 2 ms, plus the ~6.1 ms per request of
    host work the speculative loop showed at batch 64 (docs/performance.md section 3). A guess, said so."""
    sizes = sorted(STEP_MS_47_LAYERS)
    near = min(sizes, key=lambda b: abs(math.log(b) - math.log(max(batch, 1))))
    plain = STEP_MS_47_LAYERS[near] * st.layers / 47 + 1.0
    return 3 * plain + 2.0 * st.draft_len + SPEC_HOST_MS_PER_REQUEST * batch if spec else plain


def estimate_s(st: Settings) -> dict[str, float]:
    """Seconds per sweep (decode waves plus ~1 ms per layer per 1k prefill tokens, plus 30 s to build)."""
    out = {}
    for label, spec in (("plain", False), ("eagle3", True)):
        total = 30.0
        for c in st.concurrencies:
            waves = sum(math.ceil(n / c) for n in counts(c))
            steps = st.osl / (st.synthetic_al if spec else 1.0)
            prefill_s = sum(counts(c)) * st.isl / 1024 * st.layers * 1e-3
            total += waves * steps * step_ms(st, c, spec) / 1e3 + prefill_s
        out[label] = total
    return out


def combined_rows(results: dict[str, list[dict]]) -> list[dict]:
    keys = ("tpot_ms_median", "tpot_ms_p90", "interactivity_x90", "total_tok_per_s_per_gpu", "spec_acceptance_length",
            "ttft_ms_median", "ttft_ms_p99", "interactivity_e2e_p90", "prefix_cache_hit_rate",
            "prefix_hit_rate_possible", "num_skipped_too_long")
    return [{"sweep": label, "concurrency": r["concurrency"], "status": r.get("error", "ok"),
             **{k: r.get(k) for k in keys}} for label, rows in results.items() for r in rows]


def print_table(rows: list[dict], st: Settings) -> None:
    where = "per-GPU TP8/EP8 shapes" if st.device == "cuda" else "tiny shapes on CPU (smoke)"
    print(f"\nMiniMax-M3 {where}, {st.layers} layers, dummy weights, {st.kv_cache_dtype} KV, ISL/OSL {st.isl}/{st.osl}, "
          f"TP 1; eagle3 = synthetic AL {st.synthetic_al}, draft_len {st.draft_len}, "
          f"{'CUDA graphs' if st.spec_graphs else 'no graphs'}; plain = CUDA graphs on CUDA")
    print(f"{'sweep':>7} {'C':>4} {'TPOT p50 ms':>12} {'TPOT p90 ms':>12} {'x90':>8} {'tok/s/GPU':>10} {'AL':>5}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['sweep']:>7} {r['concurrency']:>4}  {r['status']}")
            continue
        al = "-" if r["spec_acceptance_length"] is None else f"{r['spec_acceptance_length']:.2f}"
        print(f"{r['sweep']:>7} {r['concurrency']:>4} {r['tpot_ms_median']:>12.2f} {r['tpot_ms_p90']:>12.2f} "
              f"{r['interactivity_x90']:>8.1f} {r['total_tok_per_s_per_gpu']:>10.0f} {al:>5}" + _trace_cols(r, st))


def _trace_cols(r: dict, st: Settings) -> str:
    """TTFT p50 / p99 ms, E2E-normalized interactivity P90, prefix hit reached / possible, skipped (trace only)."""
    if st.trace is None:
        return ""
    hit = "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.3f}"
    return (f"  TTFT {r['ttft_ms_median']:.0f}/{r['ttft_ms_p99']:.0f} ms  e2e-P90 {r['interactivity_e2e_p90']:.1f}"
            f"  prefix {hit}/{r['prefix_hit_rate_possible']:.3f}  skipped {r['num_skipped_too_long']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--synthetic-acceptance", type=float, default=2.8)
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=390.0, help="Start no point past this (both sweeps).")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_sweep_out"))
    p.add_argument("--cpu-smoke", action="store_true", help="Tiny shapes on CPU.")
    p.add_argument("--spec-graphs", action="store_true", help="CUDA graphs for the eagle3 sweep too (when supported).")
    p.add_argument("--sweeps", nargs="+", choices=("plain", "eagle3"), default=["plain", "eagle3"],
                   help="Which sweeps to run (one alone gets the whole --budget-s).")
    p.add_argument("--trace", default=None, help="Replay this Mooncake trace's first --max-requests requests.")
    p.add_argument("--max-requests", type=int, default=64)
    p.add_argument("--max-warmup", type=int, default=0, help="At most N warm-up requests a point (0: C).")
    p.add_argument("--trace-scale", type=float, default=1.0, help="Trace block size (512) and lengths times F.")
    p.add_argument("--max-pos", type=int, default=None, help="max_position_embeddings of the target config "
                   "(default 4096; 196608 with --trace; CPU 512).")
    return p.parse_args(argv)


def main(argv=None) -> dict[str, list[dict]]:
    args = parse_args(argv)
    st = cpu_settings(args) if args.cpu_smoke else gpu_settings(args)
    if st.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --cpu-smoke")
    est = estimate_s(st)
    print(f"estimate (rough, see step_ms): plain {est['plain']:.0f} s, eagle3 {est['eagle3']:.0f} s; "
          f"budget {st.budget_s:.0f} s (plain stops starting points at {PLAIN_SHARE * st.budget_s:.0f} s)",
          file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        results = run_sweeps(st, args.out, Path(work))
    rows = combined_rows(results)
    (args.out / "combined.json").write_text(json.dumps({"settings": asdict(st), "rows": rows}, indent=1, default=str))
    import pandas as pd

    pd.DataFrame(rows).to_csv(args.out / "combined.csv", index=False)
    print_table(rows, st)
    return results


if __name__ == "__main__":
    main()
