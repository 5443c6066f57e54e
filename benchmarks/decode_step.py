"""Decode-step benchmark of the m3bench runtime at MiniMax-M3's per-GPU TP8/EP8 shapes, against the
bytes floor of docs/performance.md, with transformers on the same GPU as the baseline.

    python benchmarks/decode_step.py                 # H200, < 8 min; table last; JSON to $OUT if set
    python benchmarks/decode_step.py --quick         # ~1 min smoke run on the GPU
    python benchmarks/decode_step.py --cpu-smoke     # tiny shapes on CPU (torch paths, no graphs)

Per-GPU shapes (M3 under TP8 attention / EP8 experts): hidden 6144, 8 query heads, 1 KV head
(4 KV heads over 8 ranks: each rank holds one, duplicated) with its 1 index head of dim 128 (the
index key head is shared), head_dim 128, rotary 64; layers 0-2 dense (MLP 12288/8 = 1536), the rest
MSA + MoE with the 16 local experts of 3072 run as a 16-expert top-4 model (each token's 4 picks all
local: the heaviest case for one rank), shared expert 3072/8 = 384; vocab 200064/8 = 25008; bf16
weights, FP8 KV (K, V and index keys), page 128, top-16 blocks. `--layers` defaults to as many as fit
in ~120 GB next to the KV of the largest batch x context; the floor is computed for the same layers.

One decode step = the model forward of B tokens (one per sequence, each at position ctx) plus the
logits of all B rows; timed as CUDA-graph replays with CUDA events, median after warm-up. Floor:
(weights read incl. E(1-(1-k/E)^B) distinct experts per MoE layer + KV read + index keys read) /
4.3 TB/s. Baselines: a Qwen2.5-0.5B-shaped dense model through `LLM.generate` vs transformers'
`generate` (tokens/s incl. a 128-token prefill, batch 1 and 16), and transformers' MiniMaxM3
(`MiniMaxM3VLForCausalLM`, eager, bf16 DynamicCache, 4 layers: 3 dense + 1 MSA/MoE) per-layer step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

import torch
from decode_checks import check_components, check_engine_graphs, check_fast_path
from decode_floor import (
    GB,
    TINY,
    M3Shapes,
    floor_of,
    layers_that_fit,
    pages_per_seq,
    resident_bytes,
)
from decode_setup import (
    decode_meta,
    engine_step_ms,
    engine_variants,
    fill_random_,
    graphed,
    hf_m3_config,
    median_ms,
    our_config,
    qwen_config,
    replay_ms,
    sync,
)


@dataclass(frozen=True)
class Plan:
    shapes: M3Shapes
    layers: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    warmup: int
    repeats: int
    qwen_tokens: int
    qwen_batches: tuple[int, ...]
    hf_m3_cases: tuple[tuple[int, int], ...]  # (batch, context)
    hf_m3_steps: int


def our_m3_steps(plan: Plan, dev: torch.device) -> list[dict]:
    from m3bench.runtime.attention.select import make_backend
    from m3bench.runtime.kv_cache import KVCache, KVDtype
    from m3bench.runtime.model import M3ForCausalLM

    s = plan.shapes
    cfg = our_config(hf_m3_config(s, plan.layers, max(plan.contexts) * 2 + s.page))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    backend = make_backend("auto", dev, cfg, s.page)  # Triton on CUDA (fused MoE too), torch on CPU
    model = M3ForCausalLM(cfg, dtype=dtype, device=dev, backend=backend)
    print(f"  attention backend {type(backend).__name__}", flush=True)
    model.init_dummy(0)
    pages = max(plan.batches) * pages_per_seq(s, max(plan.contexts)) + 1
    kv = KVCache(cfg, pages, s.page, KVDtype.FP8, dtype, dev)
    fill_random_(kv)
    rows = []
    for ctx in plan.contexts:
        for B in plan.batches:
            try:
                rows.append(_one_config(plan, model, kv, B, ctx, dev))
            except Exception as e:  # noqa: BLE001 - record it, keep the other configurations
                rows.append({"batch": B, "context": ctx, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                print(f"  B={B} ctx={ctx} FAILED: {rows[-1]['error']}", flush=True)
                _free(dev)
                continue
            print(_row_line(rows[-1]), flush=True)
    del model, kv
    return rows


@torch.inference_mode()
def _one_config(plan: Plan, model, kv, B: int, ctx: int, dev: torch.device) -> dict:
    s = plan.shapes
    meta = decode_meta(s, B, ctx, dev)
    ids = torch.randint(0, s.vocab, (B,), device=dev)
    out = torch.empty(B, s.vocab, dtype=torch.float32, device=dev)

    def step():
        out.copy_(model.compute_logits(model(ids, meta.positions, meta, kv)))

    run, graph = graphed(step, dev)
    ms = median_ms(run, dev, plan.warmup, plan.repeats)
    f = floor_of(s, plan.layers, B, ctx)
    return {"batch": B, "context": ctx, "cuda_graph": graph, "step_ms": ms, "floor_ms": f.ms, "achieved_over_floor": f.ms / ms,
                "weights_gb": f.weights_bytes / GB, "kv_gb": f.kv_bytes / GB, "index_gb": f.index_bytes / GB,
                "tokens_per_s": B / ms * 1e3, "finite": bool(torch.isfinite(out).all())}


def _row_line(r: dict) -> str:
    return (f"  B={r['batch']:<3} ctx={r['context']:<6} step {r['step_ms']:8.3f} ms  floor {r['floor_ms']:7.3f} ms"
            f"  of floor {r['achieved_over_floor']:6.1%}{'' if r['cuda_graph'] else '  (no graph)'}")


# ---- baselines --------------------------------------------------------------------------------------

def qwen_ours(plan: Plan, dev: torch.device, tiny: bool) -> dict[int, dict]:
    """Per batch size: tokens/s of LLM.generate (CUDA graphs on CUDA), the engine's decode step
    (host timestamps between tokens) and the bare graph replay of that step: their gap is host work."""
    from m3bench.runtime import LLM, SamplingParams

    cfg = our_config(qwen_config(tiny))
    bs = max(plan.qwen_batches)
    llm = LLM(None, load_format="dummy", config=cfg, device=str(dev),
              dtype="bfloat16" if dev.type == "cuda" else "float32", tokens_per_block=128 if not tiny else 16,
              max_batch_size=bs, max_num_tokens=max(2048, bs * 128), num_kv_blocks=bs * 4 + 8,
              enable_prefix_caching=False, cuda_graphs=dev.type == "cuda")
    out, default = {}, "async" if llm.async_scheduling else "sync"
    variants = engine_variants(llm)
    for B in plan.qwen_batches:
        prompts = _prompts(B, 128 if not tiny else 8, cfg.vocab_size)
        row = {"graph_replay_ms": replay_ms(llm, B, dev)}
        for mode, engine in variants.items():
            llm.engine = engine
            llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
            sync(dev)
            t0 = time.perf_counter()
            res = llm.generate(prompts, SamplingParams(max_tokens=plan.qwen_tokens, ignore_eos=True))
            sync(dev)
            row[f"{mode}_tokens_per_s"] = sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)
            row[f"{mode}_step_ms"] = engine_step_ms(res)
        out[B] = {**row, "tokens_per_s": row[f"{default}_tokens_per_s"], "engine_step_ms": row[f"{default}_step_ms"]}
    del llm
    return out


def qwen_hf(plan: Plan, dev: torch.device, tiny: bool) -> dict[int, float]:
    """tokens/s of transformers' generate (greedy, exactly qwen_tokens new tokens), per batch size."""
    import transformers

    c = qwen_config(tiny)
    with torch.device(dev):
        model = transformers.Qwen2ForCausalLM(c).to(torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    out = {}
    for B in plan.qwen_batches:
        ids = torch.tensor(_prompts(B, 128 if not tiny else 8, c.vocab_size), device=dev)
        kw = {"attention_mask": torch.ones_like(ids), "do_sample": False, "pad_token_id": 0}
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
            sync(dev)
            t0 = time.perf_counter()
            res = model.generate(ids, max_new_tokens=plan.qwen_tokens, min_new_tokens=plan.qwen_tokens, **kw)
            sync(dev)
        out[B] = B * (res.shape[1] - ids.shape[1]) / (time.perf_counter() - t0)
    del model
    return out


def _prompts(B: int, n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(B)
    return torch.randint(3, vocab, (B, n), generator=g).tolist()


def hf_m3_layer_ms(plan: Plan, dev: torch.device) -> list[dict]:
    """transformers' MiniMaxM3 (eager, 4 layers): median decode-step time per layer after a prefill."""
    import transformers

    s = plan.shapes
    layers = max(s.dense_layers + 1, 4)
    cfg = hf_m3_config(s, layers, max(c for _, c in plan.hf_m3_cases) * 2 + s.page)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        model = transformers.MiniMaxM3VLForCausalLM(cfg).to(dtype).eval()
    rows = []
    for B, ctx in plan.hf_m3_cases:
        ms = _hf_m3_case(model, s, B, ctx, plan.hf_m3_steps, dev)
        rows.append({"batch": B, "context": ctx, "layers": layers, "step_ms": ms, "per_layer_ms": ms / layers})
        print(f"  transformers M3 B={B} ctx={ctx}: {ms:.2f} ms/step, {ms / layers:.2f} ms/layer", flush=True)
    del model
    return rows


@torch.inference_mode()
def _hf_m3_case(model, s: M3Shapes, B: int, ctx: int, steps: int, dev: torch.device) -> float:
    g = torch.Generator().manual_seed(ctx)
    ids = torch.randint(3, s.vocab, (B, ctx), generator=g).to(dev)
    past = None
    for a in range(0, ctx, 1024):  # chunked prefill keeps eager attention's score tensor small
        res = model(input_ids=ids[:, a:a + 1024], past_key_values=past, use_cache=True)
        past = res.past_key_values
    nxt = res.logits[:, -1:].argmax(-1)
    times = []
    for i in range(steps + 2):
        sync(dev)
        t0 = time.perf_counter()
        res = model(input_ids=nxt, past_key_values=past, use_cache=True)
        sync(dev)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
        past, nxt = res.past_key_values, res.logits[:, -1:].argmax(-1)
    return statistics.median(times)


# ---- plan, table, main ----------------------------------------------------------------------------

def make_plan(args, on_gpu: bool) -> Plan:
    if args.cpu_smoke:
        return Plan(TINY, args.layers or 2, (1, 2), (20, 40), 1, 2, 3, (1, 2), ((1, 40),), 2)
    s = M3Shapes()
    if args.quick:
        return Plan(s, args.layers or 4, (1, 16), (1024, 8192), 2, 5, 16, (1, 16), ((1, 1024),), 3)
    batches, contexts = (1, 4, 16, 64), (1024, 8192, 32768)
    layers = args.layers or layers_that_fit(s, max(batches), max(contexts), args.budget_gb * GB)
    return Plan(s, layers, batches, contexts, 3, 20, 128, (1, 16), ((1, 1024), (16, 1024), (1, 8192), (16, 8192)), 8)


def table(res: dict) -> str:
    """The compact summary: M3 rows, then the baselines. `of floor` = floor time / step time."""
    sh = res["plan"]["shapes"]
    head = (f"MiniMax-M3 per-GPU TP8/EP8 shapes on {res['device']}: {res['layers']} layers ({sh['dense_layers']} "
            f"dense, rest MSA + MoE as {sh['experts']} experts top-{sh['top_k']}), bf16 weights, FP8 KV, page "
            f"{sh['page']}, top-{sh['topk_blocks']} blocks; CUDA graphs; floor = bytes / 4.3 TB/s")
    cols = (f"{'batch':>5} {'ctx':>6} {'step ms':>9} {'floor ms':>9} {'of floor':>9} {'tok/s':>9} "
            f"{'W GB':>6} {'KV GB':>6} {'idx GB':>6}")
    lines = [head, cols]
    for r in res.get("check_model", []):
        lines.insert(0, f"check {r['what']}: fast path vs torch rel err {r['rel_err']:.1e} "
                        f"({'ok' if r['ok'] else 'FAILED'})")
    if res.get("check_engine"):
        e = res["check_engine"]
        lines.insert(0, f"check engine + CUDA graphs: {e['identical']}/{e['total']} greedy sequences identical")
    for r in res["m3"]:
        if "error" in r:
            lines.append(f"{r['batch']:>5} {r['context']:>6} FAILED {r['error'][:100]}")
            continue
        lines.append(f"{r['batch']:>5} {r['context']:>6} {r['step_ms']:>9.3f} {r['floor_ms']:>9.3f} "
                     f"{r['achieved_over_floor']:>9.1%} {r['tokens_per_s']:>9.0f} {r['weights_gb']:>6.2f} "
                     f"{r['kv_gb']:>6.2f} {r['index_gb']:>6.2f}{'' if r['cuda_graph'] else ' (eager, no graph)'}")
    ours, hf = res.get("qwen_ours") or {}, res.get("qwen_hf") or {}
    nan = float("nan")
    for b in res["plan"]["qwen_batches"] if (ours or hf) else ():
        o = ours.get(b, {})
        lines.append(f"Qwen2.5-0.5B-shaped, B={b}, {res['plan']['qwen_tokens']} new tokens: ours "
                     f"{o.get('tokens_per_s', nan):.0f} tok/s (engine step {o.get('engine_step_ms', nan):.2f} ms, "
                     f"graph alone {o.get('graph_replay_ms', nan):.2f} ms) vs transformers {hf.get(b, nan):.0f} tok/s")
        lines.append(f"  B={b} host time per step (engine step - graph alone): sync "
                     f"{o.get('sync_step_ms', nan) - o.get('graph_replay_ms', nan):.3f} ms, async (overlap) "
                     f"{o.get('async_step_ms', nan) - o.get('graph_replay_ms', nan):.3f} ms; tok/s sync "
                     f"{o.get('sync_tokens_per_s', nan):.0f}, async {o.get('async_tokens_per_s', nan):.0f}")
    for r in res.get("hf_m3", []):
        lines.append(f"transformers MiniMaxM3 eager, B={r['batch']} ctx={r['context']}: {r['per_layer_ms']:.2f} ms/layer "
                     f"vs ours {_ours_per_layer(res, r)}")
    for name, err in res.get("errors", {}).items():
        lines.append(f"{name} FAILED: {err[:200]}")
    return "\n".join(lines)


def _ours_per_layer(res: dict, hf: dict) -> str:
    hit = [r for r in res["m3"] if r["batch"] == hf["batch"] and r["context"] == hf["context"] and "error" not in r]
    return f"{hit[0]['step_ms'] / res['layers']:.3f} ms/layer" if hit else "not measured"


def _guard(name: str, fn, res: dict):
    """Run one baseline; a failure is recorded (and printed) instead of losing the whole run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a baseline must not sink the main measurement
        res.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        print(f"{name} failed: {type(e).__name__}: {e}", flush=True)
        return None


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=None, help="model layers (default: as many as fit)")
    ap.add_argument("--budget-gb", type=float, default=120.0, help="weights + KV budget for the default layers")
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run on the GPU")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU (Triton interpreted, no graphs)")
    ap.add_argument("--check-only", action="store_true", help="only the fast-path correctness checks")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-baselines", action="store_true")
    return ap.parse_args(argv)


def run_checks(plan: Plan, dev: torch.device, tiny: bool, res: dict) -> bool:
    res["check_model"] = _guard("check_model", lambda: check_fast_path(plan.shapes, dev, tiny), res) or []
    _free(dev)
    res["check_model"] += _guard("check_components", lambda: check_components(plan.shapes, dev, tiny), res) or []
    _free(dev)
    res["check_engine"] = _guard("check_engine", lambda: check_engine_graphs(dev), res) or {}
    _free(dev)
    oks = [r["ok"] for r in res["check_model"]] + [res["check_engine"].get("ok", False)]
    return len(res["check_model"]) == 4 and all(oks)


def run_timings(plan: Plan, dev: torch.device, args, res: dict) -> None:
    t0 = time.perf_counter()
    res["m3"] = our_m3_steps(plan, dev)
    _free(dev)
    print(f"[{time.perf_counter() - t0:.0f} s] M3 decode steps done", flush=True)
    if args.skip_baselines:
        return
    res["qwen_ours"] = _guard("qwen_ours", lambda: qwen_ours(plan, dev, args.cpu_smoke), res)
    _free(dev)
    res["qwen_hf"] = _guard("qwen_hf", lambda: qwen_hf(plan, dev, args.cpu_smoke), res)
    _free(dev)
    res["hf_m3"] = _guard("hf_m3", lambda: hf_m3_layer_ms(plan, dev), res) or []


def main(argv: list[str] | None = None) -> int:
    """Exit code 0: checks passed (or skipped); 1: a check failed; 2: no GPU (without --cpu-smoke)."""
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel module is imported
    elif not torch.cuda.is_available():
        print("no CUDA device (use --cpu-smoke for the CPU smoke run)")
        return 2
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    plan, t0 = make_plan(args, not args.cpu_smoke), time.perf_counter()
    res = {"layers": plan.layers, "plan": asdict(plan), "m3": [],
           "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(dev)}
    ok = True if args.skip_checks else run_checks(plan, dev, args.cpu_smoke, res)
    print(f"[{time.perf_counter() - t0:.0f} s] checks {'passed' if ok else 'FAILED'}", flush=True)
    if not args.check_only:
        big = resident_bytes(plan.shapes, plan.layers, max(plan.batches), max(plan.contexts))
        print(f"layers {plan.layers}; weights + KV {big / GB:.1f} GB", flush=True)
        run_timings(plan, dev, args, res)
    res["checks_ok"], res["wall_s"] = ok, time.perf_counter() - t0
    _write_json(res)
    print(table(res))
    return 0 if ok else 1


def _free(dev: torch.device) -> None:
    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _write_json(res: dict) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "decode_step.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
