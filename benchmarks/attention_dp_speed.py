"""Attention DP against TP on the same GPUs: generated tok/s and the engine step time per concurrency.

    python benchmarks/attention_dp_speed.py              # 2 GPUs: MiniMax-M3 per-GPU TP8 shapes x 2 ranks, 12 layers
    python benchmarks/attention_dp_speed.py --cpu-smoke  # tiny shapes on 2 CPU processes (the plumbing)

The model is two TP8/EP8 ranks' worth of MiniMax-M3 (benchmarks/decode_floor.M3Shapes(world=2): 16 query
heads, 2 KV heads and 2 index heads, 32 experts top-4, vocab 50016), dummy weights (both layouts draw the same per-name
weights), bf16, FP8 KV, no CUDA graphs (neither layout captures them at > 1 rank), no overlap. TP 2 splits
the heads (rank: 8 query heads, 1 KV head, one all-reduce per block); attention DP 2 gives each rank half
of the requests with all heads, the routed experts split 16 / 16 with the tokens exchanged. Per concurrency
C: C prompts of --isl random tokens, --osl new tokens each (ignore_eos), one warm-up generate, then the timed
one. Columns:
  tok/s      generated tokens / wall seconds of the timed generate (prefill included)
  step ms    median over requests of the gaps between consecutive tokens (one engine step of decode)
  same       share of requests whose greedy tokens equal TP's (bf16 sums differ: a few may fork)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

import torch  # noqa: E402


def model_config(cpu_smoke: bool, layers: int):
    from dataclasses import replace

    from decode_floor import TINY, M3Shapes
    from decode_setup import hf_m3_config, our_config

    shapes = replace(TINY if cpu_smoke else M3Shapes(), world=2, index_heads=2)  # one index head per KV head
    return our_config(hf_m3_config(shapes, layers, 4096)), shapes.page


def build(cfg, page: int, cpu: bool, attention_dp: bool, max_c: int, isl: int, osl: int):
    from m3bench.runtime import LLM

    pages = max_c * -(-(isl + osl + 8) // page) + 8
    return LLM(None, load_format="dummy", config=cfg, device="cpu" if cpu else "cuda",
               dtype="float32" if cpu else "bfloat16", kv_cache_dtype="auto" if cpu else "fp8",
               tokens_per_block=page, max_batch_size=max_c, max_num_tokens=4096, num_kv_blocks=pages,
               enable_prefix_caching=False, cuda_graphs=False, async_scheduling=False,
               tensor_parallel_size=2, attention_dp=attention_dp)


def prompts_for(c: int, isl: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (isl,), generator=g).tolist() for _ in range(c)]


def measure(llm, c: int, isl: int, osl: int, vocab: int) -> tuple[dict, list[list[int]]]:
    from m3bench.runtime import SamplingParams

    params = SamplingParams(max_tokens=osl, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate(prompts_for(c, isl, vocab, seed=c + 1000), params)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts_for(c, isl, vocab, seed=c), params)
    wall_s = time.perf_counter() - start
    gaps = [statistics.median([b - a for a, b in zip(o.timings.token_s, o.timings.token_s[1:])]) for o in outs]
    row = {"tok_per_s": sum(len(o.token_ids) for o in outs) / wall_s, "step_ms": statistics.median(gaps) * 1e3}
    return row, [o.token_ids for o in outs]


def run_layout(cfg, page, args, attention_dp: bool) -> dict:
    llm = build(cfg, page, args.cpu_smoke, attention_dp, max(args.concurrency), args.isl, args.osl)
    try:
        return {c: measure(llm, c, args.isl, args.osl, cfg.vocab_size) for c in args.concurrency}
    finally:
        llm.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--isl", type=int, default=512)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128])
    args = p.parse_args()
    if args.cpu_smoke:
        args.layers, args.isl, args.osl, args.concurrency = 3, 32, 8, [1, 4]
    cfg, page = model_config(args.cpu_smoke, args.layers)
    tp, dp = run_layout(cfg, page, args, False), run_layout(cfg, page, args, True)
    print(f"attention DP 2 vs TP 2, {args.layers} layers, ISL/OSL {args.isl}/{args.osl}, "
          f"{'CPU fp32' if args.cpu_smoke else torch.cuda.get_device_name(0) + ' bf16, FP8 KV'}")
    print(f"{'C':>5} | {'TP tok/s':>9} {'TP step ms':>10} | {'DP tok/s':>9} {'DP step ms':>10} | {'DP/TP':>6} {'same':>5}")
    for c in args.concurrency:
        (a, ta), (b, tb) = tp[c], dp[c]
        same = sum(x == y for x, y in zip(ta, tb)) / c
        print(f"{c:>5} | {a['tok_per_s']:>9.1f} {a['step_ms']:>10.2f} | {b['tok_per_s']:>9.1f} {b['step_ms']:>10.2f} | "
              f"{b['tok_per_s'] / a['tok_per_s']:>6.2f} {same:>5.0%}")


if __name__ == "__main__":
    main()
