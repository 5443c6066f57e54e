"""Correctness of the GPU fast path before any timing: Triton attention + fused MoE (+ CUDA graphs)
against the torch paths, on the benchmark's shapes (or tiny ones on CPU under the interpreter)."""

from __future__ import annotations

import torch
from decode_floor import TINY, M3Shapes, pages_per_seq
from decode_setup import (
    fill_random_,
    hf_m3_config,
    our_config,
    rank_model,
    set_fast_path,
)


@torch.inference_mode()
def _path_outputs(model, kv_dtype, steps, tables, s: M3Shapes, dev) -> list[torch.Tensor]:
    from m3bench.runtime.attention.metadata import build_attn_metadata
    from m3bench.runtime.kv_cache import KVCache

    kv = KVCache(model.cfg, sum(len(t) for t in tables) + 1, s.page, kv_dtype, model.dtype, dev, model.tp)
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

    lens = [40, 21] if tiny else [2600, 700]
    steps = [(lens, lens), ([1, 1], [n + 1 for n in lens]), ([3, 3], [n + 4 for n in lens])]
    n0, n1 = (pages_per_seq(s, n + 8) for n in lens)
    tables = [list(range(n1, n1 + n0)), list(range(n1))]  # shuffled: sequence 1 owns the low pages
    model = rank_model(s, our_config(hf_m3_config(s, s.dense_layers + 1, 8192)), torch.float32, dev, None, seed=1)
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

    cfg = our_config(hf_m3_config(s, s.dense_layers + 1, 8192))
    lens = [40, 21, 33] if tiny else [2600, 700, 3000]
    tables, at = [], 0
    for n in lens:
        tables.append(list(range(at, at + pages_per_seq(s, n))))
        at += len(tables[-1])
    model = rank_model(s, cfg, torch.bfloat16, dev, None, seed=2)
    kv = KVCache(cfg, at, s.page, KVDtype.FP8, torch.bfloat16, dev, model.tp)
    fill_random_(kv)
    meta = build_attn_metadata([1, 1, 3], lens, tables, s.page, dev)
    g = torch.Generator(device=dev).manual_seed(3)
    q = torch.randn(5, s.heads, s.head_dim, generator=g, device=dev, dtype=torch.bfloat16)
    iq = torch.randn(5, s.kv_heads, s.index_dim, generator=g, device=dev, dtype=torch.bfloat16)  # the rank's heads
    sc, sparse = s.head_dim ** -0.5, cfg.sparse_layers[0]
    fast, ref = TritonBackend(), TorchBackend()
    rows = [_check_row("bf16 dense attention, fp8 KV", _rel(fast.dense(0, q, meta, kv, sc), ref.dense(0, q, meta, kv, sc)), 2e-2),
            _check_row("bf16 MSA attention, fp8 KV", _rel(fast.msa(sparse, q, iq, meta, kv, sc, cfg.msa),
                                                          ref.msa(sparse, q, iq, meta, kv, sc, cfg.msa)), 2e-2)]
    moe = model.layers[sparse].mlp
    x = torch.randn(37, s.hidden, generator=g, device=dev, dtype=torch.bfloat16)
    from m3bench.runtime.layers.moe import route

    w, ids = route(x, moe.router_weight, moe.router_bias, moe.m.top_k, moe.m.routed_scaling_factor)
    rows.append(_check_row("bf16 fused MoE (37 tokens)", _rel(moe.fused_experts(x, w, ids), moe.torch_experts(x, w, ids)), 2e-2))
    # the whole MoE layer: router aligning (<= 16 tokens), the shared expert inside (>= 5 tokens); one token: the
    # one with the most local picks (realistic routing leaves most tokens none: the check could not fail)
    local = ((ids >= moe.first_expert) & (ids < moe.first_expert + moe.w_down.shape[0])).sum(-1)
    first = int(local.argmax())
    for n in MOE_LAYER_TOKENS:
        xs = x[first:first + 1] if n == 1 else x[:n]
        rows.append(_check_row(f"bf16 MoE layer ({n} tokens)", _moe_layer_err(moe, xs), 2e-2))
    return rows


MOE_LAYER_TOKENS = (1, 8, 37)
COMPONENT_CHECKS = 3 + len(MOE_LAYER_TOKENS)  # check_components' rows


def _moe_layer_err(moe, x: torch.Tensor) -> float:
    """The MoE layer's fast path (Triton kernels) against its torch path on the same input."""
    from m3bench.runtime.kernels.backend import KernelBackend

    kb = moe.kernel_backend
    try:
        moe.kernel_backend = KernelBackend.TRITON
        fast = moe(x)
        moe.kernel_backend = KernelBackend.TORCH
        return _rel(fast, moe(x))
    finally:
        moe.kernel_backend = kb


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
