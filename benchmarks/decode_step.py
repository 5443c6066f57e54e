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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

PEAK_BYTES_PER_S = 4.3e12
GB = 1e9


@dataclass(frozen=True)
class M3Shapes:
    """Per-GPU shapes of MiniMax-M3 under TP8/EP8 (see the module docstring)."""

    hidden: int = 6144
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 128
    rotary_dim: int = 64
    index_heads: int = 1
    index_dim: int = 128
    experts: int = 16
    top_k: int = 4
    expert_inter: int = 3072
    shared_inter: int = 384
    dense_inter: int = 1536
    dense_layers: int = 3
    vocab: int = 25008
    page: int = 128
    topk_blocks: int = 16
    weight_bytes: int = 2  # bf16
    kv_bytes: int = 1  # fp8 e4m3


TINY = M3Shapes(hidden=64, heads=4, kv_heads=1, head_dim=32, rotary_dim=16, index_heads=1, index_dim=32,
                experts=4, top_k=2, expert_inter=32, shared_inter=16, dense_inter=64, dense_layers=1,
                vocab=256, page=16, topk_blocks=2)


# ---- bytes and floor (pure arithmetic) --------------------------------------------------------

def distinct_experts(E: int, k: int, B: int) -> float:
    """Expected distinct experts hit by B tokens choosing k of E uniformly: E (1 - (1 - k/E)^B)."""
    return E * (1.0 - (1.0 - k / E) ** B)


def attn_weight_bytes(s: M3Shapes, sparse: bool) -> int:
    qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
    index = s.index_heads * s.index_dim + s.index_dim if sparse else 0
    norms = 2 * s.head_dim + (2 * s.index_dim if sparse else 0) + 2 * s.hidden
    return ((qkv + index) * s.hidden + s.hidden * s.heads * s.head_dim + norms) * s.weight_bytes


def expert_bytes(s: M3Shapes) -> int:
    return 3 * s.expert_inter * s.hidden * s.weight_bytes


def moe_fixed_bytes(s: M3Shapes) -> int:
    """Router (fp32 weight + bias) and the shared expert: read every step."""
    return (s.experts * s.hidden + s.experts) * 4 + 3 * s.shared_inter * s.hidden * s.weight_bytes


def layer_kinds(s: M3Shapes, layers: int) -> list[bool]:
    """True for an MSA + MoE layer, False for a dense one (the first dense_layers)."""
    return [i >= s.dense_layers for i in range(layers)]


def weight_bytes_read(s: M3Shapes, layers: int, B: int) -> float:
    """Bytes of weights one decode step of B tokens reads (lm_head whole, B embedding rows)."""
    total = s.vocab * s.hidden * s.weight_bytes + B * s.hidden * s.weight_bytes + s.hidden * s.weight_bytes
    for sparse in layer_kinds(s, layers):
        total += attn_weight_bytes(s, sparse)
        if sparse:
            total += moe_fixed_bytes(s) + distinct_experts(s.experts, s.top_k, B) * expert_bytes(s)
        else:
            total += 3 * s.dense_inter * s.hidden * s.weight_bytes
    return total


def kv_bytes_read(s: M3Shapes, layers: int, B: int, ctx: int) -> int:
    """K/V bytes: dense layers read the whole context; MSA layers at most topk_blocks pages."""
    per_token = 2 * s.kv_heads * s.head_dim * s.kv_bytes
    sparse_tokens = min(ctx, s.topk_blocks * s.page)
    return sum(B * (sparse_tokens if sp else ctx) * per_token for sp in layer_kinds(s, layers))


def index_bytes_read(s: M3Shapes, layers: int, B: int, ctx: int) -> int:
    """The indexer reads every index key of the context on each MSA layer."""
    return sum(B * ctx * s.index_dim * s.kv_bytes for sp in layer_kinds(s, layers) if sp)


@dataclass(frozen=True)
class Floor:
    weights_bytes: float
    kv_bytes: float
    index_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.index_bytes

    @property
    def ms(self) -> float:
        return self.total_bytes / PEAK_BYTES_PER_S * 1e3


def floor_of(s: M3Shapes, layers: int, B: int, ctx: int) -> Floor:
    return Floor(weight_bytes_read(s, layers, B), kv_bytes_read(s, layers, B, ctx),
                 index_bytes_read(s, layers, B, ctx))


def pages_per_seq(s: M3Shapes, ctx: int) -> int:
    """Pages a sequence needs to hold ctx tokens plus the one this step writes."""
    return -(-(ctx + 1) // s.page)


def total_weight_bytes(s: M3Shapes, layers: int) -> float:
    """Every weight resident on the GPU (embedding and lm_head both, all local experts)."""
    return weight_bytes_read(s, layers, 0) + s.vocab * s.hidden * s.weight_bytes + sum(
        s.experts * expert_bytes(s) for sp in layer_kinds(s, layers) if sp)


def resident_bytes(s: M3Shapes, layers: int, B: int, ctx: int) -> float:
    """All weights plus the KV pool (one scratch page) for B sequences of ctx tokens."""
    pages = B * pages_per_seq(s, ctx) + 1
    kv = 0
    for sparse in layer_kinds(s, layers):
        kv += pages * s.page * (2 * s.kv_heads * s.head_dim + (s.index_dim if sparse else 0)) * s.kv_bytes
    return total_weight_bytes(s, layers) + kv


def layers_that_fit(s: M3Shapes, B: int, ctx: int, budget_bytes: float, max_layers: int = 60) -> int:
    fits = [n for n in range(1, max_layers + 1) if resident_bytes(s, n, B, ctx) <= budget_bytes]
    return max(fits) if fits else 1


# ---- configs ------------------------------------------------------------------------------------

def m3_hf_kwargs(s: M3Shapes, layers: int, max_pos: int) -> dict:
    """MiniMaxM3VLTextConfig keyword arguments at the given shapes (also parsed by ModelConfig)."""
    kinds = layer_kinds(s, layers)
    return {
        "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.expert_inter, "num_hidden_layers": layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "rotary_dim": s.rotary_dim, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                                      "partial_rotary_factor": s.rotary_dim / s.head_dim},
        "dense_intermediate_size": s.dense_inter, "shared_intermediate_size": s.shared_inter,
        "num_local_experts": s.experts, "num_experts_per_tok": s.top_k, "routed_scaling_factor": 2.0,
        "mlp_layer_types": ["sparse" if k else "dense" for k in kinds],
        "layer_types": ["minimax_m3_sparse" if k else "full_attention" for k in kinds],
        "index_n_heads": s.index_heads, "index_head_dim": s.index_dim, "index_block_size": s.page,
        "index_topk_blocks": s.topk_blocks, "index_local_blocks": 1, "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def hf_m3_config(s: M3Shapes, layers: int, max_pos: int):
    import transformers

    c = transformers.MiniMaxM3VLTextConfig(**m3_hf_kwargs(s, layers, max_pos))
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"
    c.architectures = ["MiniMaxM3VLForCausalLM"]
    return c


def our_config(hf_config):
    """The runtime's ModelConfig parsed from the same transformers config (one source of shapes)."""
    from m3bench.runtime.config import ModelConfig

    return ModelConfig.from_dict(hf_config.to_dict())


def qwen_config(tiny: bool):
    """Qwen2.5-0.5B shapes (or a tiny Qwen2 for the CPU smoke run)."""
    import transformers

    if tiny:
        kw = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 256}
    else:
        kw = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                  "num_key_value_heads": 2, "vocab_size": 151936}
    c = transformers.Qwen2Config(**kw, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6,
                                 bos_token_id=1, eos_token_id=2)
    c._attn_implementation = "eager" if tiny else "sdpa"
    c.architectures = ["Qwen2ForCausalLM"]
    return c


# ---- timing ---------------------------------------------------------------------------------------

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def median_ms(fn, dev: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of fn(): CUDA events around each call on CUDA, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graphed(fn, dev: torch.device):
    """(fn captured in a CUDA graph after two eager runs on a side stream, True); (fn, False) on CPU
    or when capture fails (the failure is printed and the eager launches are timed instead)."""
    if dev.type != "cuda":
        return fn, False
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except RuntimeError as e:
        print(f"  CUDA graph capture failed ({str(e)[:160]}); timing eager launches", flush=True)
        torch.cuda.synchronize(dev)
        return fn, False
    return g.replay, True


# ---- our runtime: M3 decode step --------------------------------------------------------------------

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


def fill_random_(kv) -> None:
    """Random (finite) FP8 / bf16 contents in every K, V and index-key page."""
    g = torch.Generator(device=kv.k[0].data.device).manual_seed(0)
    for store in [*kv.k, *kv.v, *(s for s in kv.ik if s is not None)]:
        for chunk in store.data.split(max(1, (1 << 28) // max(1, store.data[0].numel())), dim=0):
            src = torch.randn(chunk.shape, generator=g, device=chunk.device, dtype=torch.bfloat16)
            chunk.copy_(src.to(chunk.dtype))


def decode_meta(s: M3Shapes, B: int, ctx: int, dev: torch.device):
    """Metadata of one decode token per sequence; sequence b owns pages b*n .. b*n+n-1."""
    from m3bench.runtime.attention.metadata import AttnMetadata

    n = pages_per_seq(s, ctx)
    tables = torch.arange(B * n, dtype=torch.int32, device=dev).view(B, n)
    pos = torch.full((B,), ctx, dtype=torch.int64, device=dev)
    slots = tables[:, ctx // s.page].long() * s.page + ctx % s.page
    return AttnMetadata(query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=dev),
                        seq_lens=torch.full((B,), ctx + 1, dtype=torch.int32, device=dev), block_tables=tables,
                        slot_mapping=slots, positions=pos, query_lens_host=[1] * B, seq_lens_host=[ctx + 1] * B)


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

def qwen_ours(plan: Plan, dev: torch.device, tiny: bool) -> dict[int, float]:
    """tokens/s of LLM.generate (CUDA graphs on CUDA), per batch size."""
    from m3bench.runtime import LLM, SamplingParams

    cfg = our_config(qwen_config(tiny))
    bs = max(plan.qwen_batches)
    llm = LLM(None, load_format="dummy", config=cfg, device=str(dev),
              dtype="bfloat16" if dev.type == "cuda" else "float32", tokens_per_block=128 if not tiny else 16,
              max_batch_size=bs, max_num_tokens=max(2048, bs * 128), num_kv_blocks=bs * 4 + 8,
              enable_prefix_caching=False, cuda_graphs=dev.type == "cuda")
    out = {}
    for B in plan.qwen_batches:
        prompts = _prompts(B, 128 if not tiny else 8, cfg.vocab_size)
        params = SamplingParams(max_tokens=plan.qwen_tokens, ignore_eos=True)
        llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        sync(dev)
        t0 = time.perf_counter()
        res = llm.generate(prompts, params)
        sync(dev)
        out[B] = sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)
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


# ---- correctness of the fast path (before any timing) ---------------------------------------------

def set_fast_path(model, on: bool) -> None:
    """Triton attention + fused MoE (on) or the torch backend + torch MoE (off, the reference)."""
    from m3bench.runtime.attention.torch_backend import TorchBackend
    from m3bench.runtime.attention.triton_backend import TritonBackend
    from m3bench.runtime.kernels.backend import KernelBackend
    from m3bench.runtime.layers.moe import SparseMoe

    model.backend = TritonBackend() if on else TorchBackend()
    for layer in model.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON if on else KernelBackend.TORCH


@torch.inference_mode()
def _path_outputs(model, kv_dtype, steps, tables, s: M3Shapes, dev) -> list[torch.Tensor]:
    from m3bench.runtime.attention.metadata import build_attn_metadata
    from m3bench.runtime.kv_cache import KVCache

    kv = KVCache(model.cfg, sum(len(t) for t in tables) + 1, s.page, kv_dtype, model.dtype, dev)
    g = torch.Generator().manual_seed(5)
    outs = []
    for q_lens, seq_lens in steps:
        meta = build_attn_metadata(q_lens, seq_lens, tables, s.page, dev)
        ids = torch.randint(0, s.vocab, (sum(q_lens),), generator=g).to(dev)
        outs.append(model(ids, meta.positions, meta, kv).float())
    return outs


def check_fast_path(s: M3Shapes, dev: torch.device, tiny: bool) -> list[dict]:
    """fp32 model: prefill (MSA selection active), decode, a 3-token chunk, fast path vs reference.
    (In bf16 a whole-model comparison is not meaningful: rounding flips discrete expert / block
    choices; bf16 is checked per component in check_components.)"""
    from m3bench.runtime.kv_cache import KVDtype
    from m3bench.runtime.model import M3ForCausalLM

    lens = [40, 21] if tiny else [2600, 700]
    steps = [(lens, lens), ([1, 1], [n + 1 for n in lens]), ([3, 3], [n + 4 for n in lens])]
    n0, n1 = (pages_per_seq(s, n + 8) for n in lens)
    tables = [list(range(n1, n1 + n0)), list(range(n1))]  # shuffled: sequence 1 owns the low pages
    model = M3ForCausalLM(our_config(hf_m3_config(s, s.dense_layers + 1, 8192)), dtype=torch.float32, device=dev)
    model.init_dummy(1)
    got = [None, None]
    for on in (False, True):
        set_fast_path(model, on)
        got[on] = _path_outputs(model, KVDtype.BF16, steps, tables, s, dev)
    per_token = torch.cat([(a - b).norm(dim=-1) / b.norm(dim=-1) for a, b in zip(got[True], got[False])])
    err = float(per_token.quantile(0.99))  # a rare exact-tie flip of a discrete choice spares the rest
    return [_check_row("fp32 model, bf16 KV, prefill+decode+chunk (p99 over tokens)", err, 2e-3)]


def _check_row(what: str, err: float, tol: float) -> dict:
    print(f"  check {what}: rel err {err:.2e} (tol {tol:.0e})", flush=True)
    return {"what": what, "rel_err": err, "tol": tol, "ok": err <= tol}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@torch.inference_mode()
def check_components(s: M3Shapes, dev: torch.device, tiny: bool) -> list[dict]:
    """bf16 at the benchmark's shapes: attention (dense, MSA) on FP8 pages and the fused MoE, each
    against its torch path on the same inputs."""
    from m3bench.runtime.attention.metadata import build_attn_metadata
    from m3bench.runtime.attention.torch_backend import TorchBackend
    from m3bench.runtime.attention.triton_backend import TritonBackend
    from m3bench.runtime.kv_cache import KVCache, KVDtype
    from m3bench.runtime.model import M3ForCausalLM

    cfg = our_config(hf_m3_config(s, s.dense_layers + 1, 8192))
    lens = [40, 21, 33] if tiny else [2600, 700, 3000]
    tables, at = [], 0
    for n in lens:
        tables.append(list(range(at, at + pages_per_seq(s, n))))
        at += len(tables[-1])
    kv = KVCache(cfg, at, s.page, KVDtype.FP8, torch.bfloat16, dev)
    fill_random_(kv)
    meta = build_attn_metadata([1, 1, 3], lens, tables, s.page, dev)
    g = torch.Generator(device=dev).manual_seed(3)
    q = torch.randn(5, s.heads, s.head_dim, generator=g, device=dev, dtype=torch.bfloat16)
    iq = torch.randn(5, s.index_heads, s.index_dim, generator=g, device=dev, dtype=torch.bfloat16)
    sc, sparse = s.head_dim ** -0.5, cfg.sparse_layers[0]
    fast, ref = TritonBackend(), TorchBackend()
    rows = [_check_row("bf16 dense attention, fp8 KV", _rel(fast.dense(0, q, meta, kv, sc), ref.dense(0, q, meta, kv, sc)), 2e-2),
            _check_row("bf16 MSA attention, fp8 KV", _rel(fast.msa(sparse, q, iq, meta, kv, sc, cfg.msa),
                                                          ref.msa(sparse, q, iq, meta, kv, sc, cfg.msa)), 2e-2)]
    model = M3ForCausalLM(cfg, dtype=torch.bfloat16, device=dev)
    model.init_dummy(2)
    moe = model.layers[sparse].mlp
    x = torch.randn(37, s.hidden, generator=g, device=dev, dtype=torch.bfloat16)
    from m3bench.runtime.layers.moe import route

    w, ids = route(x, moe.router_weight, moe.router_bias, moe.m.top_k, moe.m.routed_scaling_factor)
    rows.append(_check_row("bf16 fused MoE (37 tokens)", _rel(moe.fused_experts(x, w, ids), moe.torch_experts(x, w, ids)), 2e-2))
    return rows


def check_engine_graphs(dev: torch.device) -> dict:
    """Greedy tokens of LLM with CUDA graphs + Triton + fused MoE equal the torch paths (fp32, tiny M3)."""
    from m3bench.runtime import LLM, SamplingParams

    cfg = our_config(hf_m3_config(TINY, 3, 1024))
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 40, 33)]
    outs = []
    for fast in (False, True):
        llm = LLM(None, load_format="dummy", config=cfg, device=str(dev), seed=2, tokens_per_block=TINY.page,
                  num_kv_blocks=32, max_batch_size=8, attention_backend="triton" if fast else "torch",
                  cuda_graphs=fast and dev.type == "cuda")
        set_fast_path(llm.model, fast)
        outs.append([o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))])
    same = sum(a == b for a, b in zip(*outs))
    print(f"  engine with CUDA graphs: {same}/{len(prompts)} greedy sequences identical to the torch path", flush=True)
    return {"identical": same, "total": len(prompts), "ok": same == len(prompts)}


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
    if ours or hf:
        lines.append(f"Qwen2.5-0.5B-shaped dense, tok/s incl. prefill ({res['plan']['qwen_tokens']} new tokens): " +
                     "; ".join(f"B={b}: ours {ours.get(b, float('nan')):.0f} vs transformers {hf.get(b, float('nan')):.0f}"
                               for b in res["plan"]["qwen_batches"]))
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
