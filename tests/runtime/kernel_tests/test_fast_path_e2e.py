"""The whole fast path (Triton attention with MSA selection, fused norm + RoPE + KV write, fused
residual add + norm, fused router, fused MoE; CUDA graphs on the GPU) against the fp32 torch path
through LLM.generate: prompt logprobs and greedy tokens of a random checkpoint whose prompt is
longer than topk_blocks x block tokens, so MSA really selects.

GPU (`gpu`): real head geometry (head_dim 128, rotary 64, GQA 4:1, index dim 128, page = block = 128,
top-16) and a 2600-token prompt (21 blocks). CPU: the same code at tiny geometry under the Triton
interpreter (head_dim 16, block 16, top-2, a 45-token prompt: 3 blocks).
"""

from __future__ import annotations

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime import LLM, SamplingParams
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

REAL = TinySpec(vocab_size=2048, hidden_size=512, num_layers=3, num_heads=8, num_kv_heads=2, head_dim=128,
                rotary_dim=64, dense_intermediate_size=512, num_experts=8, top_k=2, intermediate_size=256,
                shared_intermediate_size=256, index_dim=128, block_size=128, topk_blocks=16,
                max_position_embeddings=8192)
TINY = TinySpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rotary_dim=8, dense_intermediate_size=64, num_experts=4, top_k=2, intermediate_size=32,
                shared_intermediate_size=32, index_dim=16, block_size=16, topk_blocks=2, max_position_embeddings=256)


def _prompts(spec: TinySpec, lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(len(lengths))
    return [torch.randint(3, spec.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _run(path, spec: TinySpec, prompts, device: str, dtype: str, fast: bool, kv: str = "auto", new: int = 8):
    blocks = sum(-(-(len(p) + 16) // spec.block_size) for p in prompts) + 4
    llm = LLM(str(path), device=device, dtype=dtype, kv_cache_dtype=kv, tokens_per_block=spec.block_size,
              num_kv_blocks=blocks, max_batch_size=len(prompts), max_num_tokens=4096, enable_prefix_caching=False,
              attention_backend="triton" if fast else "torch", cuda_graphs=fast and device == "cuda", seed=0)
    for layer in llm.model.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON if fast else KernelBackend.TORCH
    outs = llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, prompt_logprobs=1))
    return [torch.tensor(o.prompt_logprobs, dtype=torch.float64) for o in outs], [o.token_ids for o in outs]


def compare_fast_path(tmp_path, spec: TinySpec, lengths: list[int], device: str, new: int = 8) -> dict:
    """fp32 fast path vs fp32 torch path: max |d logprob| over every prompt token, greedy tokens."""
    assert max(lengths) > spec.topk_blocks * spec.block_size  # MSA selects a subset of the blocks
    path = write_tiny_checkpoint(tmp_path / "ckpt", seed=3, spec=spec)
    prompts = _prompts(spec, lengths)
    ref_lp, ref_tok = _run(path, spec, prompts, device, "float32", fast=False, new=new)
    got_lp, got_tok = _run(path, spec, prompts, device, "float32", fast=True, new=new)
    diff = torch.cat([(a - b).abs() for a, b in zip(got_lp, ref_lp)])
    return {"max_abs_logprob_err": float(diff.max()), "p999_abs_logprob_err": float(diff.quantile(0.999)),
            "same_tokens": got_tok == ref_tok, "path": path, "prompts": prompts, "ref": (ref_lp, ref_tok)}


@pytest.mark.parametrize("select_in_attention", [False, True])
def test_fast_path_matches_torch_on_cpu_tiny_geometry(tmp_path, triton_interpreter, monkeypatch, select_in_attention):
    from m3bench.runtime.attention import triton_backend

    monkeypatch.setattr(triton_backend, "SELECT_IN_ATTENTION", select_in_attention)  # the top-k launch or none
    res = compare_fast_path(tmp_path, TINY, [45, 9], "cpu", new=3)  # 45 tokens: 3 blocks, 2 selected
    assert res["max_abs_logprob_err"] < 1e-4
    assert res["same_tokens"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("select_in_attention", [False, True])
def test_fast_path_matches_fp32_torch_on_gpu_real_geometry(tmp_path, monkeypatch, select_in_attention):
    from m3bench.runtime.attention import triton_backend

    monkeypatch.setattr(triton_backend, "SELECT_IN_ATTENTION", select_in_attention)
    res = compare_fast_path(tmp_path, REAL, [2600, 300], "cuda")
    # p99.9 over the 2898 prompt tokens: a rare fp32 near-tie may flip one discrete block / expert choice
    assert res["p999_abs_logprob_err"] < 2e-3 and res["max_abs_logprob_err"] < 0.5, res
    assert res["same_tokens"]
    # bf16 weights and activations with FP8 KV (the benchmark's fast path): close, not equal (a sanity
    # bound: rounding moves every logit a little; the strict check is the fp32 one above)
    got_lp, _ = _run(res["path"], REAL, res["prompts"], "cuda", "bfloat16", fast=True, kv="fp8")
    ref_lp, _ = res["ref"]
    diff = torch.cat([(a - b).abs() for a, b in zip(got_lp, ref_lp)])
    assert diff.isfinite().all() and diff.mean().item() < 0.25, diff.mean().item()


def _launches_fused_after(monkeypatch, on: bool):
    """Both switches of the next launch's selection on (the default) or off: the MSA top-k in the attention launch, one
    token's routing in the experts' gate|up launch (read when the model is built)."""
    from m3bench.runtime.attention import triton_backend
    from m3bench.runtime.layers import moe

    monkeypatch.setattr(triton_backend, "SELECT_IN_ATTENTION", on)
    monkeypatch.setattr(moe, "ROUTE_IN_EXPERTS", on)


def test_routing_in_the_experts_launch_on_cpu_tiny_geometry(tmp_path, triton_interpreter, monkeypatch):
    """One prompt, so every decode step is one token: with the switches on its MoE layers launch no router kernel
    (the 45-token prompt, past router_align's 16 tokens, routes with its own launches either way), and the fast path
    still matches fp32 torch; with them off the decode steps launch the router's align kernel."""
    from m3bench.runtime.kernels import router_triton

    aligned = recorded_launches(monkeypatch, (router_triton,), names=("router_align_kernel",))
    _launches_fused_after(monkeypatch, False)
    compare_fast_path(tmp_path / "off", TINY, [45], "cpu", new=3)
    assert aligned
    aligned.clear()
    _launches_fused_after(monkeypatch, True)
    res = compare_fast_path(tmp_path / "on", TINY, [45], "cpu", new=3)
    assert res["max_abs_logprob_err"] < 1e-4 and res["same_tokens"]
    assert not aligned


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("on", [False, True])
def test_routing_in_the_experts_launch_on_gpu_real_geometry(tmp_path, monkeypatch, on):
    """One prompt, so every decode step is one token: the MoE layers route in the experts' gate|up launch
    (layers.moe.ROUTE_IN_EXPERTS), the MSA layers select in the attention launch (on, the default), or both in their
    own launches; either against fp32 torch."""
    _launches_fused_after(monkeypatch, on)
    res = compare_fast_path(tmp_path, REAL, [2600], "cuda", new=24)
    assert res["p999_abs_logprob_err"] < 2e-3 and res["max_abs_logprob_err"] < 0.5, res
    assert res["same_tokens"]
