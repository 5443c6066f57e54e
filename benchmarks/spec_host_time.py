"""Host time per speculative decode step, SEPARATE vs SHARED draft-KV layout, batch 64 (tiny M3 + tiny Eagle3).

    python benchmarks/spec_host_time.py                       # CPU, tiny model, page 128, draft_len 3
    python benchmarks/spec_host_time.py --device cuda         # the same on the GPU (torch attention on CPU,
                                                              # the engine's default backend on CUDA)
    python benchmarks/spec_host_time.py --json out.json
    python benchmarks/spec_host_time.py --device cuda --cuda-graphs   # each layout eager, then with the
                                                              # verify + chain CUDA graphs (Triton attention)

Per layout: 64 requests of 256-token prompts are prefilled, then `--steps` decode steps (each: target
verify of 1 + K tokens per request, accept, draft extend + K - 1 chained steps) are timed. Per step:
- wall: the whole `LLM.step()`;
- forward: time inside the target's and the draft's forward / compute_logits (and the draft's
  combine_features) calls, synchronized on CUDA;
- host: wall - forward: Python scheduling, input building, verification bookkeeping and the draft
  block tables (on CUDA also kernel-launch time of the non-forward work);
- draft_kv: inside the layout's `reserve` + `tables` (the per-request draft block-table rebuild that
  SEPARATE does on the host and SHARED replaces with a view of the target's device table).
Medians over the timed steps. The model is tiny, so `host` dominates on CPU just as on an H200.
With `--cuda-graphs` every layout is measured twice, eager and with graphs, both on the Triton attention
backend; `wall` is then the figure to compare: graph replays do not call the wrapped forwards, so
`forward` counts only the eager parts (the draft extend) and `replays` the verify graphs replayed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

import torch

from m3bench.runtime.attention.select import make_backend
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.llm import LLM, SamplingParams
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.tiny_draft import tiny_draft_config
from m3bench.runtime.tiny import TinySpec, m3_text_config

SPEC = TinySpec(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                rotary_dim=16, dense_intermediate_size=256, num_experts=4, top_k=2, intermediate_size=64,
                shared_intermediate_size=64, index_dim=32, block_size=128, max_position_embeddings=4096)


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.device, self.total_s = device, 0.0

    @contextmanager
    def span(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.total_s += time.perf_counter() - t


def wrap(obj, name: str, timer: Timer) -> None:
    fn = getattr(obj, name)

    def timed(*a, **k):
        with timer.span():
            return fn(*a, **k)

    setattr(obj, name, timed)


def build(device: str, dtype: torch.dtype, seed: int = 0, triton: bool = False
          ) -> tuple[M3ForCausalLM, Eagle3Draft]:
    cfg = ModelConfig.from_dict(m3_text_config(SPEC, bos_id=0, eos_id=SPEC.vocab_size - 1))
    backend = make_backend("triton", device, cfg, 128) if triton else None
    model = M3ForCausalLM(cfg, dtype=dtype, device=device, backend=backend)
    model.init_dummy(seed)
    draft = Eagle3Draft(tiny_draft_config(cfg), dtype, device, backend=model.backend)
    draft.init_dummy(seed + 1)
    return model, draft


def measure(layout: str, args, graphs: bool = False) -> dict:
    model, draft = build(args.device, torch.float32 if args.device == "cpu" else torch.bfloat16,
                         triton=args.cuda_graphs)
    llm = LLM(model, speculative_model=draft, draft_len=args.draft_len, draft_kv=layout, kv_cache_dtype="bf16",
              tokens_per_block=128, num_kv_blocks=args.batch * 4 + 8, max_batch_size=args.batch,
              max_num_tokens=args.batch * args.prompt_len, cuda_graphs=graphs)
    g = torch.Generator().manual_seed(1)
    for _ in range(args.batch):
        llm.add_request(torch.randint(1, SPEC.vocab_size - 1, (args.prompt_len,), generator=g).tolist(),
                        SamplingParams(max_tokens=args.steps * (args.draft_len + 1) + 64, ignore_eos=True))
    llm.step()  # the prefill of all 64 (one step: the token budget holds them)
    for _ in range(args.warmup):
        llm.step()
    dev = torch.device(args.device)
    fwd, dkv = Timer(dev), Timer(dev)
    for obj, names in ((llm.model, ("forward", "compute_logits")), (draft, ("forward", "compute_logits", "combine_features"))):
        for name in names:
            wrap(obj, name, fwd)
    wrap(llm.engine.spec.layout, "reserve", dkv)
    wrap(llm.engine.spec.layout, "tables", dkv)
    rows = []
    for _ in range(args.steps):
        fwd.total_s = dkv.total_s = 0.0
        t = time.perf_counter()
        llm.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t
        rows.append((wall, fwd.total_s, dkv.total_s))
    med = lambda i: statistics.median(r[i] for r in rows) * 1e3  # noqa: E731
    running = len(llm.engine.scheduler.running)
    replays = llm.engine.spec.graphs.replays["verify"] if graphs else 0
    return {"layout": layout, "graphs": graphs, "replays": replays, "batch": running, "draft_len": args.draft_len, "steps": args.steps,
            "wall_ms": med(0), "forward_ms": med(1), "host_ms": statistics.median((r[0] - r[1]) * 1e3 for r in rows),
            "draft_kv_ms": med(2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layouts", default="separate,shared", help="Comma list, measured in this order.")
    p.add_argument("--cuda-graphs", action="store_true", help="Also measure each layout with CUDA graphs.")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.cuda_graphs and not args.device.startswith("cuda"):
        p.error("--cuda-graphs needs --device cuda")
    modes = (False, True) if args.cuda_graphs else (False,)
    results = [measure(layout, args, g) for layout in args.layouts.split(",") for g in modes]
    print(f"{'layout':<10}{'graphs':>7}{'replays':>8}{'batch':>6}{'K':>3}{'wall ms':>10}{'forward ms':>12}{'host ms':>10}{'draft-KV ms':>13}")
    for r in results:
        print(f"{r['layout']:<10}{'on' if r['graphs'] else 'off':>7}{r['replays']:>8}{r['batch']:>6}{r['draft_len']:>3}{r['wall_ms']:>10.2f}{r['forward_ms']:>12.2f}"
              f"{r['host_ms']:>10.2f}{r['draft_kv_ms']:>13.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
