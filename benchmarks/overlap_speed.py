"""Overlap scheduling (`async_scheduling`) against the synchronous engine: decode tok/s, host time per
step, and whether the device was still busy when step() returned.

    python benchmarks/overlap_speed.py                 # H200: Qwen2.5-0.5B shapes and 12-layer M3 shapes
    python benchmarks/overlap_speed.py --cpu-smoke     # tiny Qwen2 on CPU (the plumbing; no overlap on CPU)
    python benchmarks/overlap_speed.py --spec --models m3      # Eagle3 (dummy draft, synthetic AL 2.8, K 3)
                                                       # under both engines: speculation with overlap

One LLM per model (dummy weights, bf16, CUDA graphs); its runner, scheduler and pool are driven by a
synchronous `Engine` and an overlapped one (`Engine(..., overlap=True)`) in turn. Per batch size B: B prompts
of 128 random tokens, `--tokens` new tokens each (ignore_eos), one warm-up generate, then the timed one. Columns:
  tok/s          generated tokens / wall seconds of the timed generate (prefill included)
  step ms        median over requests of the host time between consecutive tokens
  graph ms       the captured decode graph of that batch, replayed alone (the device's share)
  busy %         (async) share of step() calls that returned while the step they launched was still
                 running on the device: the overlap actually achieved
  same           greedy tokens identical between the two engines
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

import torch  # noqa: E402

from decode_setup import engine_step_ms, engine_variants, replay_ms  # noqa: E402

from m3bench.runtime.engine import Engine  # noqa: E402


def model_configs(cpu_smoke: bool, m3_layers: int) -> dict:
    """name -> ModelConfig: Qwen2.5-0.5B shapes, and MiniMax-M3 per-GPU TP8 shapes at `m3_layers` layers."""
    from decode_floor import M3Shapes
    from decode_setup import hf_m3_config, our_config, qwen_config

    if cpu_smoke:
        return {"qwen2-tiny": our_config(qwen_config(True))}
    return {"qwen2.5-0.5b": our_config(qwen_config(False)),
            f"m3-{m3_layers}L": our_config(hf_m3_config(M3Shapes(), m3_layers, 4096))}


def build_llm(cfg, dev: torch.device, max_batch: int, prompt_len: int, new_tokens: int, spec: bool = False):
    from m3bench.runtime import LLM

    page = 16 if dev.type == "cpu" else 128
    slack = 40 if spec else 8  # tokens past prompt + output; speculation: the 2K look-ahead and a verify window
    pages_per_seq = -(-(prompt_len + new_tokens + slack) // page)
    draft = dict(speculative_model=dummy_draft(cfg, dev), draft_len=SPEC_K, draft_kv="shared",
                 synthetic_acceptance_length=SPEC_AL) if spec else {}
    return LLM(None, load_format="dummy", config=cfg, device=str(dev),
               dtype="bfloat16" if dev.type == "cuda" else "float32", tokens_per_block=page,
               kv_cache_dtype="fp8" if dev.type == "cuda" else "auto", max_batch_size=max_batch,
               max_num_tokens=max(2048, max_batch * prompt_len), num_kv_blocks=max_batch * pages_per_seq + 8,
               enable_prefix_caching=False, cuda_graphs=dev.type == "cuda", **draft)


SPEC_K, SPEC_AL = 3, 2.8  # --spec: draft_len and the forced mean acceptance length


def dummy_draft(cfg, dev: torch.device) -> Path:
    """A directory holding an Eagle3 draft config for `cfg` (random weights: load_format dummy)."""
    import tempfile

    from m3bench.runtime.speculative.tiny_draft import tiny_draft_config

    dest = Path(tempfile.mkdtemp(prefix="overlap-draft-"))
    (dest / "config.json").write_text(json.dumps(tiny_draft_config(cfg).to_dict(), indent=1))
    return dest


def _cuda(llm) -> bool:
    return llm.device.type == "cuda"


class ProbedOverlapEngine(Engine):
    """An overlapped Engine that counts the steps whose launched work was still running on the device when
    step() returned."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, overlap=True, **kwargs)
        self.busy = self.returned = 0

    def step(self):
        deltas = super().step()
        f = self.flight
        if f is not None and f.done is not None:
            self.returned += 1
            self.busy += not f.done.query()
        return deltas


def prompts_for(batch: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(3, min(vocab, 30000), (batch, length), generator=g).tolist()


def measure(llm, variants: dict, batch: int, prompt_len: int, new_tokens: int) -> dict:
    from m3bench.runtime import SamplingParams

    prompts = prompts_for(batch, prompt_len, llm.config.vocab_size)
    row: dict = {"batch": batch, "graph_ms": replay_ms(llm, batch, llm.device)}
    tokens = {}
    for mode, engine in variants.items():
        llm.engine = engine
        if engine.spec is not None:  # the two engines share one SpecRunner: it follows the engine driving it
            engine.spec.drafts_on_device = engine.overlap
        llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        if hasattr(engine, "busy"):
            engine.busy = engine.returned = 0
        _sync(llm)
        if engine.spec is not None and engine.spec.synth is not None:  # the same forced counts for both
            engine.spec.synth.generator.manual_seed(0)
        t0 = time.perf_counter()
        res = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        _sync(llm)
        wall = time.perf_counter() - t0
        tokens[mode] = [r.token_ids for r in res]
        row[f"{mode}_tok_s"] = sum(len(t) for t in tokens[mode]) / wall
        row[f"{mode}_step_ms"] = engine_step_ms(res)
        if hasattr(engine, "busy"):
            row["async_busy"] = engine.busy / engine.returned if engine.returned else float("nan")
    row["same"] = tokens["sync"] == tokens["async"]
    row["speedup"] = row["async_tok_s"] / row["sync_tok_s"]
    return row


def _sync(llm) -> None:
    if _cuda(llm):
        torch.cuda.synchronize()


def table(results: dict) -> str:
    head = (f"{'model':>14} {'B':>4} {'sync tok/s':>11} {'async tok/s':>12} {'x':>6} {'sync step':>10} "
            f"{'async step':>11} {'graph ms':>9} {'busy %':>7} {'same':>5}")
    lines = [head]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"{name:>14} {r['batch']:>4} {r['sync_tok_s']:>11.0f} {r['async_tok_s']:>12.0f} "
                         f"{r['speedup']:>6.3f} {r['sync_step_ms']:>10.3f} {r['async_step_ms']:>11.3f} "
                         f"{r['graph_ms']:>9.3f} {100 * r.get('async_busy', float('nan')):>7.1f} "
                         f"{'yes' if r['same'] else 'NO':>5}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny Qwen2 on CPU")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 4 16 64 (CPU: 1 2)")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens per request (default 256; CPU 8)")
    ap.add_argument("--m3-layers", type=int, default=12)
    ap.add_argument("--models", nargs="+", default=None, help="subset of: qwen2.5-0.5b m3 (default both)")
    ap.add_argument("--spec", action="store_true", help=f"Eagle3 (dummy draft, synthetic AL {SPEC_AL}, K {SPEC_K})")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here too")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    """Exit 0 when every row's tokens are identical between the engines, 1 otherwise, 2 without a GPU."""
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-smoke)")
        return 2
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    batches = tuple(args.batches or ((1, 2) if args.cpu_smoke else (1, 4, 16, 64)))
    new_tokens, prompt_len = args.tokens or (8 if args.cpu_smoke else 256), 8 if args.cpu_smoke else 128
    results = {}
    for name, cfg in model_configs(args.cpu_smoke, args.m3_layers).items():
        if args.models and not any(name.startswith(m) for m in args.models):
            continue
        llm = build_llm(cfg, dev, max(batches), prompt_len, new_tokens, args.spec)
        variants = engine_variants(llm, ProbedOverlapEngine)
        results[name] = [measure(llm, variants, b, prompt_len, new_tokens) for b in batches]
        print(f"{name} done", flush=True)
        del llm, variants
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(table(results))
    out = args.json or (Path(os.environ["OUT"]) / "overlap_speed.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
    return 0 if all(r["same"] for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
