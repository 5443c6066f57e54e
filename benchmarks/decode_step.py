"""Decode-step benchmark of the m3bench runtime as one faithful TP8/EP8 rank of MiniMax-M3, against
the bytes floor of docs/performance.md, with transformers on the same GPU as the baseline.

    python benchmarks/decode_step.py                 # H200, < 8 min; table last; JSON to $OUT if set
    python benchmarks/decode_step.py --quick         # ~1 min smoke run on the GPU
    python benchmarks/decode_step.py --cpu-smoke     # tiny shapes on CPU (torch paths, no graphs)
    python benchmarks/decode_step.py --profile       # kernels per layer (torch profiler), B = 1 and 64
    python benchmarks/decode_step.py --check-only --pdl on   # the checks with every Triton kernel launched with PDL
    python benchmarks/decode_step.py --ops-sets skinny skinny-pdl skinny-pdl-early   # PDL off / on / early trigger
    python benchmarks/decode_step.py --batches 1 --draws 4   # B1 realistic as the mean of 4 routing draws

The rank (decode_floor.RANK, rank 0 of 8, run alone: collectives skipped, SoloRank): the full
model's config (64 query heads, 4 KV heads, 4 index heads, 128 experts, vocab 200064) sharded by the
runtime's own TP code: 8 query heads, the KV head duplicated to 1 per rank, the index projection
replicated (all 4 index heads of 128 computed, the one serving the rank's KV head kept), a router
over all 128 experts of which the rank owns 16, shared expert 3072/8, dense MLP 12288/8, vocab
200064/8 = 25008; head_dim 128, rotary 64; bf16 weights, FP8 KV (K, V and index keys), page 128,
top-16 blocks. `--layers` defaults to as many as fit in `--budget-gb` next to the KV of the
largest batch x context (60 at contexts up to 8k in 120 GB).

Two routings per configuration, side by side: `realistic` (the dummy router as drawn: about
4 x 16/128 = 0.5 local picks per token; the table reports what the step produced) and `all-local`
(the rank's experts biased up so every pick is local: the worst case, the rows of the earlier
runs). Each row's floor counts the distinct local experts that routing actually read. At batch 1 one draw's local
picks vary (0.39-0.58 a token over 57 layers seen on the H200, ~25 us a local pick): `--draws N` times the
realistic rows over N input-token draws and reports their mean (and each).

One decode step = the model forward of B tokens (one per sequence, each at position ctx) plus the
logits of the rank's vocab slice; the token ids come from the rank's own vocabulary slice (a token
outside it would embed to zeros here: its rows arrive through the embedding all-reduce skipped); timed as CUDA-graph replays with CUDA events, median after
warm-up; no all-reduces (one GPU; TP8 adds two per layer, ~10 us each at batch 1: an estimate).
vLLM's anchor is printed beside it: 8.4 ms per token for 60 layers on 8 x H200 (TP8, concurrency 4,
all-reduces included), ~140 us per layer. Baselines: a Qwen2.5-0.5B-shaped dense model through
`LLM.generate` vs transformers' `generate` (batch 1 and 16), and transformers' MiniMaxM3
(`MiniMaxM3VLForCausalLM`, eager, 4 layers at the old world-1 per-GPU shapes) per-layer step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

import torch
from decode_checks import (
    COMPONENT_CHECKS,
    check_components,
    check_engine_graphs,
    check_fast_path,
)
from decode_floor import (
    GB,
    RANK,
    TINY,
    TINY_RANK,
    M3Shapes,
    floor_of,
    layers_that_fit,
    pages_per_seq,
    peak_bytes_per_s,
    peak_source,
    resident_bytes,
)
from decode_routing import Routing, routing_stats, set_routing
from floor_bandwidth import use_device_bandwidth
from decode_setup import (
    OpsSet,
    decode_meta,
    engine_step_ms,
    engine_variants,
    fill_random_,
    graphed,
    hf_m3_config,
    median_ms,
    our_config,
    pdl_mode,
    qwen_config,
    rank_model,
    replay_ms,
    set_ops,
    sync,
)

VLLM_ANCHOR_MS, VLLM_ANCHOR_LAYERS = 8.4, 60  # MiniMax-M3, 8 x H200, TP8, concurrency 4 (docs/performance.md)


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
    baseline_shapes: M3Shapes = M3Shapes()  # transformers' M3: world-1 per-GPU shapes
    routings: tuple[Routing, ...] = (Routing.REALISTIC, Routing.ALL_LOCAL)
    ops_sets: tuple[str, ...] = (OpsSet.runtime().value,)  # OpsSet values timed side by side (--ops-sets)
    draws: int = 1  # realistic rows: the mean over this many routing draws (other input tokens each; --draws)


def build_rank(plan: Plan, dev: torch.device):
    """(model, kv) of the benchmark's rank: dummy weights, random FP8 KV for the largest case."""
    from m3bench.runtime.attention.select import make_backend
    from m3bench.runtime.kv_cache import KVCache, KVDtype

    s = plan.shapes
    cfg = our_config(hf_m3_config(s, plan.layers, max(plan.contexts) * 2 + s.page))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    backend = make_backend("auto", dev, cfg, s.page)  # Triton on CUDA (fused MoE too), torch on CPU
    model = rank_model(s, cfg, dtype, dev, backend)
    print(f"  attention backend {type(backend).__name__}; rank 0 of {s.world}", flush=True)
    pages = max(plan.batches) * pages_per_seq(s, max(plan.contexts)) + 1
    kv = KVCache(cfg, pages, s.page, KVDtype.FP8, dtype, dev, model.tp)
    fill_random_(kv)
    return model, kv


def our_m3_steps(plan: Plan, dev: torch.device) -> list[dict]:
    with pdl_mode():  # set_ops switches PDL per ops set; the run's own mode after
        return _m3_steps(plan, dev)


def _m3_steps(plan: Plan, dev: torch.device) -> list[dict]:
    model, kv = build_rank(plan, dev)
    rows = []
    for ctx in plan.contexts:
        for B in plan.batches:
            for routing, ops in ((r, o) for r in plan.routings for o in plan.ops_sets):
                try:
                    set_routing(model, routing)
                    set_ops(model, OpsSet(ops))
                    rows.append({**_one_config(plan, model, kv, B, ctx, routing, dev), "ops": ops})
                except Exception as e:  # noqa: BLE001 - record it, keep the other configurations
                    rows.append({"batch": B, "context": ctx, "routing": routing.value, "ops": ops,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    print(f"  B={B} ctx={ctx} {routing.value} FAILED: {rows[-1]['error']}", flush=True)
                    _free(dev)
                    continue
                print(_row_line(rows[-1]), flush=True)
    del model, kv
    return rows


def draw_ids(vocab: int, B: int, ctx: int, draw: int) -> torch.Tensor:
    """The step's input tokens for routing draw `draw` (draw 0: the benchmark's tokens before draws existed)."""
    return torch.randint(0, vocab, (B,), generator=torch.Generator().manual_seed(B + ctx + 7919 * draw))


@torch.inference_mode()
def _one_config(plan: Plan, model, kv, B: int, ctx: int, routing: Routing, dev: torch.device) -> dict:
    """One row; realistic routing with plan.draws > 1: the mean over the draws (each draw's figures in 'draws')."""
    s = plan.shapes
    meta = decode_meta(s, B, ctx, dev)
    ids = draw_ids(s.vocab, B, ctx, 0).to(dev)
    out = torch.empty(B, s.vocab, dtype=torch.float32, device=dev)

    def step():
        out.copy_(model.compute_logits(model(ids, meta.positions, meta, kv)))

    run, graph = graphed(step, dev)
    draws = []
    for d in range(plan.draws if routing is Routing.REALISTIC else 1):
        ids.copy_(draw_ids(s.vocab, B, ctx, d))  # the captured graph reads ids: replays take the new tokens
        stats = routing_stats(model, step)  # one eager step: the routing every replay repeats
        ms = median_ms(run, dev, plan.warmup, plan.repeats)
        draws.append((ms, floor_of(s, plan.layers, B, ctx, list(stats.experts_read)), stats))
    return {"batch": B, "context": ctx, "routing": routing.value, "cuda_graph": graph,
            **_mean_of_draws(draws, plan.layers, B), "finite": bool(torch.isfinite(out).all())}


def _mean_of_draws(draws: list, layers: int, B: int) -> dict:
    """Step time, floor and routing figures averaged over the draws; 'draws' lists each when there are several."""
    n = len(draws)
    ms, floor_ms = sum(d[0] for d in draws) / n, sum(d[1].ms for d in draws) / n
    mean = lambda get: sum(get(d) for d in draws) / n  # noqa: E731
    row = {"step_ms": ms, "floor_ms": floor_ms, "achieved_over_floor": floor_ms / ms, "us_per_layer": ms / layers * 1e3,
           "local_picks_per_token": mean(lambda d: d[2].local_picks_per_token),
           "experts_per_layer": mean(lambda d: d[2].experts_per_layer),
           "weights_gb": mean(lambda d: d[1].weights_bytes) / GB, "kv_gb": draws[0][1].kv_bytes / GB,
           "index_gb": draws[0][1].index_bytes / GB, "tokens_per_s": B / ms * 1e3}
    if n > 1:
        row["draws"] = [{"step_ms": d[0], "floor_ms": d[1].ms, "local_picks_per_token": d[2].local_picks_per_token}
                        for d in draws]
    return row


def _row_line(r: dict) -> str:
    draws = r.get("draws", ())
    line = (f"  B={r['batch']:<3} ctx={r['context']:<6} {r['routing']:<9} {r['ops']:<16} step {r['step_ms']:8.3f} ms  "
            f"floor {r['floor_ms']:7.3f} ms  of floor {r['achieved_over_floor']:6.1%}  local picks/token "
            f"{r['local_picks_per_token']:.2f}{'' if r['cuda_graph'] else '  (no graph)'}")
    if draws:
        line += f"  (mean of {len(draws)} draws)"
    for i, d in enumerate(draws):
        line += (f"\n    draw {i}: step {d['step_ms']:8.3f} ms  floor {d['floor_ms']:7.3f} ms  local picks/token "
                 f"{d['local_picks_per_token']:.2f}")
    return line


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

    s = plan.baseline_shapes
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
    ops = (OpsSet.UNFUSED.value,) if args.unfused else tuple(args.ops_sets or (OpsSet.runtime().value,))
    return replace(_base_plan(args), ops_sets=ops, draws=args.draws)


def _base_plan(args) -> Plan:
    if args.cpu_smoke:
        return Plan(TINY_RANK, args.layers or 2, tuple(args.batches or (1, 2)), tuple(args.contexts or (20, 40)),
                    1, 2, 3, (1, 2), ((1, 40),), 2, TINY)
    s = RANK
    if args.quick:
        return Plan(s, args.layers or 4, tuple(args.batches or (1, 64)), tuple(args.contexts or (1024, 8192)),
                    2, 5, 16, (1, 16), ((1, 1024),), 3)
    batches, contexts = tuple(args.batches or (1, 4, 16, 64)), tuple(args.contexts or (1024, 8192))
    layers = args.layers or layers_that_fit(s, max(batches), max(contexts), args.budget_gb * GB)
    return Plan(s, layers, batches, contexts, 3, 20, 128, (1, 16), ((1, 1024), (16, 1024), (1, 8192), (16, 8192)), 8)


def table(res: dict) -> str:
    """The compact summary: M3 rows, then the baselines. `of floor` = floor time / step time."""
    sh = res["plan"]["shapes"]
    head = (f"MiniMax-M3, one TP{sh['world']}/EP{sh['world']} rank on {res['device']}: {res['layers']} layers "
            f"({sh['dense_layers']} dense, rest MSA + MoE), {sh['heads']} query heads, {sh['kv_heads']} KV head, "
            f"{sh['index_heads']} index heads (replicated), router over {sh['experts'] * sh['world']} experts of "
            f"which {sh['experts']} local, top-{sh['top_k']}, vocab {sh['vocab']}; bf16 weights, FP8 KV, page "
            f"{sh['page']}, top-{sh['topk_blocks']} blocks; CUDA graphs; no all-reduces; "
            f"ops sets {', '.join(res['plan']['ops_sets'])} (decode_setup.OpsSet); "
            f"floor = bytes / {peak_bytes_per_s() / 1e12:.2f} TB/s ({peak_source()}) for the routing that ran")
    cols = (f"{'batch':>5} {'ctx':>6} {'routing':>9} {'ops':>16} {'picks':>5} {'exp/L':>5} {'step ms':>9} {'floor ms':>9} "
            f"{'of floor':>8} {'us/layer':>8} {'tok/s':>8} {'W GB':>6} {'KV GB':>6} {'idx GB':>6}")
    lines = [head, cols]
    for r in res.get("check_model", []):
        lines.insert(0, f"check {r['what']}, PDL {res.get('pdl', 'off')}: fast path vs torch rel err "
                        f"{r['rel_err']:.1e} ({'ok' if r['ok'] else 'FAILED'})")
    if res.get("check_engine"):
        e = res["check_engine"]
        lines.insert(0, f"check engine + CUDA graphs: {e['identical']}/{e['total']} greedy sequences identical")
    for r in res["m3"]:
        lines.append(_table_row(r))
    lines += ops_comparison(res["m3"], res["layers"])
    if res["m3"]:
        lines.append(f"picks = local expert picks per token (of {sh['top_k']}), exp/L = distinct local experts read "
                     f"per MoE layer; vLLM anchor (8 x H200, TP8, conc. 4, all-reduces included): "
                     f"{VLLM_ANCHOR_MS} ms / {VLLM_ANCHOR_LAYERS} layers = "
                     f"{VLLM_ANCHOR_MS / VLLM_ANCHOR_LAYERS * 1e3:.0f} us per layer; a TP8 rank adds 2 all-reduces "
                     f"per layer to us/layer (~10 us each at batch 1: an estimate, not measured here)")
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


def ops_comparison(rows: list[dict], layers: int) -> list[str]:
    """Before / after per (batch, context, routing) when several ops sets ran: step ms of each set,
    the last set's us per layer and share of the floor, and its speed-up over the first set."""
    sets = list(dict.fromkeys(r["ops"] for r in rows if "error" not in r))
    if len(sets) < 2:
        return []
    by = {(r["batch"], r["context"], r["routing"], r["ops"]): r for r in rows if "error" not in r}
    width = {o: max(12, len(o) + 3) for o in sets}
    out = [f"{'batch':>5} {'ctx':>6} {'routing':>9} " + " ".join(f"{o + ' ms':>{width[o]}}" for o in sets)
           + f" {'us/layer':>8} {'of floor':>8} {'speed-up':>8}"]
    for b, c, rt in dict.fromkeys((r["batch"], r["context"], r["routing"]) for r in rows):
        got = [by.get((b, c, rt, o)) for o in sets]
        if any(g is None for g in got):
            continue
        last = got[-1]
        out.append(f"{b:>5} {c:>6} {rt:>9} " + " ".join(f"{g['step_ms']:>{width[g['ops']]}.3f}" for g in got)
                   + f" {last['step_ms'] / layers * 1e3:>8.1f} {last['achieved_over_floor']:>8.1%}"
                   + f" {got[0]['step_ms'] / last['step_ms']:>7.2f}x")
    return out


def _table_row(r: dict) -> str:
    if "error" in r:
        return f"{r['batch']:>5} {r['context']:>6} {r.get('routing', ''):>9} {r.get('ops', ''):>16} FAILED {r['error'][:100]}"
    return (f"{r['batch']:>5} {r['context']:>6} {r['routing']:>9} {r['ops']:>16} {r['local_picks_per_token']:>5.2f} "
            f"{r['experts_per_layer']:>5.1f} {r['step_ms']:>9.3f} {r['floor_ms']:>9.3f} {r['achieved_over_floor']:>8.1%} "
            f"{r['us_per_layer']:>8.1f} {r['tokens_per_s']:>8.0f} {r['weights_gb']:>6.2f} {r['kv_gb']:>6.2f} "
            f"{r['index_gb']:>6.2f}{'' if r['cuda_graph'] else ' (eager, no graph)'}")


def _ours_per_layer(res: dict, hf: dict) -> str:
    hit = [r for r in res["m3"] if r["batch"] == hf["batch"] and r["context"] == hf["context"] and "error" not in r
           and r.get("routing") == Routing.ALL_LOCAL.value]
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
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default 1 4 16 64)")
    ap.add_argument("--contexts", type=int, nargs="+", default=None, help="contexts (default 1024 8192)")
    ap.add_argument("--profile", action="store_true", help="kernels per layer (torch profiler), then exit")
    ap.add_argument("--full-layers", type=int, default=None, help="--profile: layers of the step it sums to (60)")
    ap.add_argument("--unfused", action="store_true", help="same as --ops-sets unfused (the fast path before any fusion)")
    ap.add_argument("--ops-sets", nargs="+", choices=[o.value for o in OpsSet], default=None,
                    help="fused-op sets to time side by side on one model (default: the runtime's, "
                         f"{OpsSet.runtime().value}; --profile: all)")
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run on the GPU")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU (Triton interpreted, no graphs)")
    ap.add_argument("--check-only", action="store_true", help="only the fast-path correctness checks")
    ap.add_argument("--pdl", choices=["off", "on", "early"], default=None,
                    help="programmatic dependent launch of the Triton kernels for the checks and baselines "
                         "(kernels.backend.Pdl; default: the runtime's); the timed ops sets choose their own")
    ap.add_argument("--draws", type=int, default=1,
                    help="realistic rows: the mean over N routing draws (other input tokens each), each draw listed")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-baselines", action="store_true")
    return ap.parse_args(argv)


def run_profile(plan: Plan, dev: torch.device, args, res: dict) -> None:
    """--profile: kernels per layer at batch 1 and 64 (CPU: the smoke plan's batches), one context."""
    from decode_profile import profile_lines, profile_rank, profile_summary

    model, kv = build_rank(plan, dev)
    batches = tuple(args.batches or ((1, 2) if args.cpu_smoke else (1, 64)))
    ctx = (args.contexts or [40 if args.cpu_smoke else 8192])[0]
    parts = []
    sets = (args.ops_sets or [o.value for o in OpsSet]) if hasattr(model.backend, "fuse_ops") else ["fused"]
    with pdl_mode():  # set_ops switches PDL per ops set
        for ops in sets:  # before ... after
            set_ops(model, OpsSet(ops))
            parts += profile_rank(model, kv, plan.shapes, batches, ctx, dev, 2 if args.cpu_smoke else 10, ops)
    res["profile"] = [asdict(p) for p in parts]
    print("\n".join(profile_lines(parts, timed=dev.type == "cuda")), flush=True)
    full = (TINY_RANK if args.cpu_smoke else RANK)
    print("\n".join(profile_summary(parts, args.full_layers or 60, full.dense_layers)), flush=True)


def run_checks(plan: Plan, dev: torch.device, tiny: bool, res: dict) -> bool:
    t0 = time.perf_counter()
    _started("the fast path against torch", t0)
    res["check_model"] = _guard("check_model", lambda: check_fast_path(plan.shapes, dev, tiny), res) or []
    _free(dev)
    _started("each fused kernel against torch", t0)
    res["check_model"] += _guard("check_components", lambda: check_components(plan.shapes, dev, tiny), res) or []
    _free(dev)
    _started("the engine's greedy tokens with CUDA graphs", t0)
    res["check_engine"] = _guard("check_engine", lambda: check_engine_graphs(dev), res) or {}
    _free(dev)
    oks = [r["ok"] for r in res["check_model"]] + [res["check_engine"].get("ok", False)]
    return len(res["check_model"]) == 1 + COMPONENT_CHECKS and all(oks)  # a check that raised: missing row


def _started(check: str, t0: float) -> None:
    """A progress line: the checks run for minutes at a rank's shapes before their first result."""
    print(f"[{time.perf_counter() - t0:.0f} s] checking {check}", flush=True)


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
    from m3bench.runtime.kernels.backend import Pdl

    with pdl_mode(Pdl(args.pdl) if args.pdl else None):
        return run(args)


def run(args) -> int:
    """main's work, under the run's PDL mode."""
    from m3bench.runtime.kernels.backend import PDL

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if args.profile and args.layers is None:  # one dense and one MSA + MoE layer suffice
        args.layers = (TINY_RANK if args.cpu_smoke else RANK).dense_layers + 1
    plan, t0 = make_plan(args, not args.cpu_smoke), time.perf_counter()
    res = {"layers": plan.layers, "plan": asdict(plan), "m3": [], "pdl": PDL["launch"].value,
           "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(dev)}
    if args.profile:
        run_profile(plan, dev, args, res)
        _write_json(res, "decode_profile.json")
        return 0
    ok = True if args.skip_checks else run_checks(plan, dev, args.cpu_smoke, res)
    print(f"[{time.perf_counter() - t0:.0f} s] checks (PDL {res['pdl']}) {'passed' if ok else 'FAILED'}", flush=True)
    if not args.check_only:
        res["floor_bandwidth"] = use_device_bandwidth(dev)
        print(res["floor_bandwidth"], flush=True)
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


def _write_json(res: dict, name: str = "decode_step.json") -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
