"""Long-prompt prefill of the bundled runtime at MiniMax-M3's per-GPU TP8/EP8 shapes: TTFT and prefill
tokens/s at 8k / 32k / 128k against the floor (weights, the indexer over every index key, the selected
blocks' sparse attention, dense layers' causal attention).

    python benchmarks/prefill_long.py                       # H200: 12 layers, bf16, FP8 KV, chunks of 8192
    python benchmarks/prefill_long.py --layers 47 --chunk 16384 --contexts 8192,32768,131072
    python benchmarks/prefill_long.py --cpu-smoke           # tiny shapes on CPU (the plumbing; minutes at most)

One LLM (dummy weights, prefix caching off, Triton attention on CUDA) with max_model_len the longest
context; per context L, one prompt of L random ids through `LLM.generate(max_tokens=1)`: the engine
prefills it in chunks of `--chunk` tokens (the MSA indexer scores each chunk's queries against every
index key before them) and samples one token. TTFT = wall time of that call after a warm-up call
(median of `--repeats`); tok/s = L / TTFT.

Floor per context (790 TFLOP/s bf16; the device's copy rate, measured at the start, floor_bandwidth.py):
  FLOPs  2 x (active weights per token) x L  (all of a token's expert picks local, as decode_step.py)
         + dense layers: causal attention 4 Hq d L^2 / 2
         + MSA layers:   indexer 2 Hi di L^2 / 2  +  sparse attention 4 Hq d sum_p min(p, topk x page)
  bytes  per chunk: every weight once, the index keys of the context so far and topk x page tokens of
         K/V per MSA layer, the whole context's K/V per dense layer; plus the KV written once
  floor = max(FLOPs / 790e12, bytes / 4.3e12); printed with each part, and achieved / floor.
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

from decode_floor import TINY, M3Shapes, attn_weight_bytes, expert_bytes, layer_kinds, peak_bytes_per_s  # noqa: E402

PEAK_FLOPS = 790e12


# ---- floor (pure arithmetic) ----------------------------------------------------------------------

def active_weight_params(s: M3Shapes, layers: int) -> float:
    """Weights one token multiplies by (its top_k experts all local), lm_head excluded (one row per prompt)."""
    total = 0.0
    for sparse in layer_kinds(s, layers):
        total += attn_weight_bytes(s, sparse) / s.weight_bytes
        if sparse:
            total += s.top_k * expert_bytes(s) / s.weight_bytes + 3 * s.shared_inter * s.hidden + s.experts * s.hidden
        else:
            total += 3 * s.dense_inter * s.hidden
    return total


def sparse_keys_sum(L: int, window: int) -> float:
    """sum over positions p = 1..L of min(p, window): keys a query attends under top-k selection."""
    w = min(L, window)
    return w * (w + 1) / 2 + (L - w) * window


def prefill_flops(s: M3Shapes, layers: int, L: int) -> dict:
    """FLOPs of prefilling L tokens, by part."""
    kinds = layer_kinds(s, layers)
    n_sparse, n_dense = sum(kinds), len(kinds) - sum(kinds)
    causal = L * (L + 1) / 2
    return {"weights": 2.0 * active_weight_params(s, layers) * L + 2.0 * s.vocab * s.hidden,
            "dense_attention": n_dense * 4.0 * s.heads * s.head_dim * causal,
            "indexer": n_sparse * 2.0 * s.index_heads * s.index_dim * causal,
            "sparse_attention": n_sparse * 4.0 * s.heads * s.head_dim * sparse_keys_sum(L, s.topk_blocks * s.page)}


def prefill_bytes(s: M3Shapes, layers: int, L: int, chunk: int, weight_bytes: float) -> dict:
    """Bytes a chunked prefill must move at least, by part (see the module docstring)."""
    kinds = layer_kinds(s, layers)
    ends = list(range(min(chunk, L), L, chunk)) + [L]
    kv_tok = 2 * s.kv_heads * s.head_dim * s.kv_bytes
    index_read = sum(e * s.index_dim * s.kv_bytes for e in ends) * sum(kinds)
    selected = len(ends) * min(L, s.topk_blocks * s.page) * kv_tok * sum(kinds)
    dense_kv = sum(e * kv_tok for e in ends) * (len(kinds) - sum(kinds))
    written = L * sum(kv_tok + (s.index_dim * s.kv_bytes if sp else 0) for sp in kinds)
    return {"weights": len(ends) * weight_bytes, "index_keys": index_read, "selected_blocks": selected,
            "dense_kv": dense_kv, "kv_written": written}


@dataclass(frozen=True)
class PrefillFloor:
    flops: float
    bytes: float

    @property
    def ms(self) -> float:
        return max(self.flops / PEAK_FLOPS, self.bytes / peak_bytes_per_s()) * 1e3


# ---- the run -------------------------------------------------------------------------------------

def build_llm(cfg, dev: str, max_len: int, chunk: int, page: int):
    from m3bench.runtime import LLM

    cuda = dev == "cuda"
    return LLM(None, config=cfg, load_format="dummy", device=dev, dtype="bfloat16" if cuda else "float32",
               kv_cache_dtype="fp8" if cuda else "auto", tokens_per_block=page, max_batch_size=1,
               max_num_tokens=chunk, num_kv_blocks=-(-(max_len + 1) // page) + 1, max_model_len=max_len,
               enable_prefix_caching=False, attention_backend="triton" if cuda else "torch")


def ttft_s(llm, L: int, repeats: int, vocab: int) -> float:
    """Median wall time of one L-token prompt to its first sampled token (after one warm-up)."""
    import torch

    from m3bench.runtime import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
    gen = torch.Generator().manual_seed(L)
    times = []
    for i in range(repeats + 1):
        prompt = torch.randint(3, vocab, (L,), generator=gen).tolist()
        t0 = time.perf_counter()
        llm.generate([prompt], params)
        if i:  # the first call warms up (kernel compilation, allocator)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(s: M3Shapes, layers: int, contexts: list[int], chunk: int, repeats: int, dev: str) -> list[dict]:
    from decode_floor import total_weight_bytes
    from decode_setup import hf_m3_config, our_config

    cfg = our_config(hf_m3_config(s, layers, max(contexts) + s.page))
    llm = build_llm(cfg, dev, max(contexts) + 1, chunk, s.page)
    rows = []
    for L in contexts:
        t = ttft_s(llm, L, repeats, s.vocab)
        flops, moved = prefill_flops(s, layers, L), prefill_bytes(s, layers, L, chunk, total_weight_bytes(s, layers))
        floor = PrefillFloor(sum(flops.values()), sum(moved.values()))
        rows.append({"context": L, "ttft_ms": t * 1e3, "tok_per_s": L / t, "floor_ms": floor.ms,
                     "of_floor": floor.ms / (t * 1e3), "flops": flops, "bytes": moved})
    return rows


def print_table(rows: list[dict], title: str) -> None:
    print(title)
    print(f"{'context':>8} {'TTFT ms':>10} {'tok/s':>10} {'floor ms':>9} {'of floor':>8}  "
          f"{'indexer TF':>10} {'weights TF':>10} {'attn TF':>8} {'index GB':>8}")
    for r in rows:
        f, b = r["flops"], r["bytes"]
        attn = f["dense_attention"] + f["sparse_attention"]
        print(f"{r['context']:>8} {r['ttft_ms']:>10.1f} {r['tok_per_s']:>10.0f} {r['floor_ms']:>9.1f} "
              f"{100 * r['of_floor']:>7.1f}%  {f['indexer'] / 1e12:>10.2f} {f['weights'] / 1e12:>10.2f} "
              f"{attn / 1e12:>8.2f} {b['index_keys'] / 1e9:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--chunk", type=int, default=8192, help="max_num_tokens: prefill chunk size")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (default $OUT/prefill_long.json)")
    args = ap.parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-smoke for the CPU smoke run)")
        return 2
    s, dev = (TINY, "cpu") if args.cpu_smoke else (M3Shapes(), "cuda")
    contexts = [256, 640] if args.cpu_smoke else [int(x) for x in args.contexts.split(",")]
    chunk = 128 if args.cpu_smoke else args.chunk
    layers = 3 if args.cpu_smoke else args.layers
    from floor_bandwidth import use_device_bandwidth

    print(use_device_bandwidth(dev), flush=True)
    rows = measure(s, layers, contexts, chunk, args.repeats, dev)
    device = "cpu" if args.cpu_smoke else torch.cuda.get_device_name(0)
    print_table(rows, f"prefill, {layers} layers, chunk {chunk}, {device}")
    out = args.json or (Path(os.environ["OUT"]) / "prefill_long.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.write_text(json.dumps({"device": device, "layers": layers, "chunk": chunk, "shapes": asdict(s),
                                   "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
