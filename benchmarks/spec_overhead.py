"""Issue 15's goals in one run: a speculative engine step against its parts timed alone, the gain those parts
predict against the gain achieved, and the host time per speculative step.

    python benchmarks/spec_overhead.py --layers 12 47 --routing all-local realistic   # H200, the whole table
    python benchmarks/spec_overhead.py                  # the same, all-local routing only (the default)
    python benchmarks/spec_overhead.py --cpu-smoke      # tiny rank on CPU, < 60 s (the plumbing; no goals)

The target is one TP8/EP8 rank of MiniMax-M3 run alone (decode_floor.RANK through decode_setup.rank_model
with PaddedSoloRank: collectives skipped, the logits padded to the full vocabulary), dummy weights, bf16, FP8
KV, page 128, CUDA graphs, overlap on; the draft an MHA Eagle3 at per-GPU TP8 shapes (gpu_sweep's 8 heads,
8 KV heads of 128, 18432/8; the full draft's config sharded by the same rank), dummy weights, K = 3, draft KV
shared, synthetic acceptance (AL 2.8 and 3.5). `--routing` (decode_routing.py): `all-local` biases the rank's
16 experts so every pick is local (the worst case: the rows of the earlier runs), `realistic` keeps the dummy
router over all 128 experts.

One model per layer count. Its speculative LLM, then its plain LLM (the same model), serve B requests of
`--prompt-len` random tokens (B in `--batches`; one request primes each engine first); after the prefill, per
routing and AL: 4 warm-up steps, then `--steps` timed `LLM.step()` calls (the engine's StepClock:
runtime/step_timing.py), then the step's parts timed alone on the state the last step left (CUDA events,
median of `--repeats`; a part whose launches outlast its device work, like the eager extend at B1, counts its
launch time, as in the engine). Columns:
  experts     distinct local experts per MoE layer the verify step's B (1 + K) tokens routed to (of 16)
  spec ms     median wall time of one speculative engine step (LLM.step(), overlap on)
  verify ms   the verify graph (the target over 1 + K tokens per request, its greedy check) replayed alone
  draft       early: the draft launched before the step lands, from the verification on the device (the
              engine's default under overlap, SpecRunner.draft_early); late: after landing (`--draft late`)
  extend ms   late: the draft's extend over the accepted positions and its first draft token (eager)
  chain ms    late: the chain graph (the draft's K - 1 further steps) replayed alone
  early ms    early: the early graph (extend over the K + 1 verify positions, first pick, chain) replayed alone
  parts ms    verify + extend + chain (late), verify + early (early)
  /parts      spec ms / parts ms                                   [goal <= 1.1]
  plain ms    median wall time of one plain engine step at the same batch (no draft, graphs, overlap on)
  pred x      AL x plain ms / parts ms: the gain the parts predict (AL: `AL meas`, what the window landed,
              so the forced counts' spread over a short window does not enter ach/pred)
  ach x       tokens/s with Eagle3 / tokens/s plain over the timed steps, both through the engine
  ach/pred    ach x / pred x                                       [goal >= 0.9]
  host p50/p90  host ms per speculative step (step wall - forward time, bench.metrics)  [goal at B64 <= 0.3]
  AL meas     tokens per request per timed step (the forced AL, as the engine landed it)
  graph %     share of the timed steps whose target forward was a verify-graph replay
The requests of a batch stay for every routing and AL, so the context grows from `--prompt-len` by at most
the windows' tokens (~100 per speculative window at AL 3.5); the JSON rows (`--json`, or $OUT/spec_overhead.json)
also hold each window's period (wall / steps) and tokens/s. Both engines pay the padded logits (PaddedSoloRank).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the m3bench package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the decode_* helper modules

import torch
from decode_floor import RANK, TINY_RANK, M3Shapes, pages_per_seq
from decode_routing import Routing, routing_stats, set_routing
from decode_setup import (
    PaddedSoloRank,
    hf_m3_config,
    median_ms,
    our_config,
    rank_model,
    sync,
)
from gpu_sweep import DRAFT_HEAD_DIM, DRAFT_HEADS, DRAFT_INTER, DRAFT_KV_HEADS
from overlap_speed import prompts_for

from m3bench.runtime.rank_step import StepLink

K = 3
MAX_PROMPT_TOKENS_PER_STEP = 8192  # the prefill's chunk (B x prompt tokens would not fit one step's activations)


@dataclass(frozen=True)
class Plan:
    shapes: M3Shapes
    layers: tuple[int, ...]
    batches: tuple[int, ...]
    als: tuple[float, ...]
    routings: tuple[Routing, ...]
    prompt_len: int
    warmup: int
    steps: int
    repeats: int
    cuda: bool
    drafts: tuple[str, ...] = ("early",)  # draft modes: early (before landing), late (after)

    @property
    def new_tokens(self) -> int:
        """Tokens each request may generate: every window of every routing and AL, no request finishes."""
        return len(self.drafts) * len(self.routings) * len(self.als) * (self.warmup + self.steps + 2) * (K + 1) + 8

    @property
    def max_pos(self) -> int:
        return self.prompt_len + self.new_tokens + 4 * K + self.shapes.page


def plan_of(args) -> Plan:
    routings = tuple(Routing(r) for r in args.routing)
    if args.cpu_smoke:
        return Plan(TINY_RANK, tuple(args.layers or (TINY_RANK.dense_layers + 1,)), tuple(args.batches or (1, 2)),
                    tuple(args.al), routings, args.prompt_len or 24, 1, args.steps or 3, 2, False, tuple(args.draft))
    return Plan(RANK, tuple(args.layers or (12, 47)), tuple(args.batches or (1, 16, 64)), tuple(args.al), routings,
                args.prompt_len or 1024, 4, args.steps or 24, args.repeats, True, tuple(args.draft))


# ---- building ---------------------------------------------------------------------------------------------


def draft_dir(cfg, s: M3Shapes, cuda: bool) -> Path:
    """An Eagle3 draft config.json for the full model of `cfg` (random weights: load_format dummy): gpu_sweep's
    per-GPU MHA shapes times the world on CUDA, the tiny draft made MHA on CPU."""
    from m3bench.runtime.speculative.tiny_draft import tiny_draft_config

    base = tiny_draft_config(cfg)
    if cuda:
        w = s.world
        base = replace(base, num_heads=DRAFT_HEADS * w, num_kv_heads=DRAFT_KV_HEADS * w, head_dim=DRAFT_HEAD_DIM,
                       intermediate_size=DRAFT_INTER * w)
    else:
        base = replace(base, num_kv_heads=base.num_heads)
    dest = Path(tempfile.mkdtemp(prefix="spec-overhead-draft-"))
    (dest / "config.json").write_text(json.dumps(base.to_dict(), indent=1))
    return dest


def build_model(plan: Plan, layers: int, dev: torch.device):
    from m3bench.runtime.attention.select import make_backend

    s = plan.shapes
    cfg = our_config(hf_m3_config(s, layers, plan.max_pos))
    backend = make_backend("auto", dev, cfg, s.page)  # Triton on CUDA, torch on CPU
    return rank_model(s, cfg, torch.bfloat16 if plan.cuda else torch.float32, dev, backend, solo=PaddedSoloRank)


@contextmanager
def cpu_graphs_allowed():
    """LLM(cuda_graphs=True) on the CPU: the speculative graphs' functions run on their static buffers
    (nothing is captured), as tests/runtime/speculative/test_spec_graphs.py does; the checks are lifted."""
    from unittest import mock

    from m3bench.runtime import engine_builder, engine_config

    with mock.patch.object(engine_config, "check_modes", lambda c: None), \
            mock.patch.object(engine_builder, "check_graphs", lambda *a: None):
        yield


def build_llm(plan: Plan, model, draft: Path | None):
    """The engine over `model`: speculative with `draft`, plain without; graphs (CPU: the spec graphs' static
    path only) and overlap on."""
    from m3bench.runtime import LLM

    B, s = max(plan.batches), plan.shapes
    spec = {"speculative_model": draft, "draft_len": K, "draft_kv": "shared", "load_format": "dummy",
            "synthetic_acceptance_length": plan.als[0]} if draft is not None else {}
    graphs = plan.cuda or draft is not None
    with nullcontext() if plan.cuda or not graphs else cpu_graphs_allowed():
        return LLM(model, kv_cache_dtype="fp8" if plan.cuda else "auto", tokens_per_block=s.page,
                   max_batch_size=B, max_num_tokens=max(MAX_PROMPT_TOKENS_PER_STEP if plan.cuda else 0,
                                                        B * (K + 1), plan.prompt_len),
                   num_kv_blocks=B * pages_per_seq(s, plan.max_pos) + 8, enable_prefix_caching=False,
                   cuda_graphs=graphs, async_scheduling=True, **spec)


class RecordingLink(StepLink):
    """TP 1's link that keeps the last draft phase's inputs (the extend and chain timed alone replay them)."""

    last = None

    def draft(self, d):
        self.last = d
        return nullcontext()


# ---- serving B requests, timing a window -----------------------------------------------------------------


def start_requests(llm, plan: Plan, B: int) -> list[int]:
    """B requests of prompt_len tokens of the rank's vocabulary slice, prefilled (no timing)."""
    from m3bench.runtime import SamplingParams

    params = SamplingParams(max_tokens=plan.new_tokens, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in prompts_for(B, plan.prompt_len, plan.shapes.vocab)]
    sched = llm.engine.scheduler
    while any(s.num_computed < len(s.prompt_ids) for s in [*sched.waiting, *sched.running]):
        llm.step()
    return rids


def stop_requests(llm, rids: list[int]) -> None:
    for rid in rids:
        llm.abort(rid)
    while llm.has_unfinished():
        llm.step()


@dataclass(frozen=True)
class Window:
    step_ms: float  # median LLM.step() wall time (the engine's StepClock)
    period_ms: float  # window wall time / steps
    tok_s: float  # tokens landed / window wall time
    tokens_per_request_step: float
    host_ms_p50: float
    host_ms_p90: float


def warm_up(llm, plan: Plan) -> None:
    for _ in range(plan.warmup):
        llm.step()
    sync(llm.device)


def prime(llm, plan: Plan) -> None:
    """One request through a few steps before any row: the graphs' and kernels' first use stays out of B1's row."""
    rids = start_requests(llm, plan, 1)
    for _ in range(2 * plan.warmup + 2):
        llm.step()
    stop_requests(llm, rids)


def timed_window(llm, plan: Plan, B: int) -> Window:
    from m3bench.bench.metrics import compute_host_timing

    dev = llm.device
    mark, tokens, t0 = llm.clock.mark(), 0, time.perf_counter()
    for _ in range(plan.steps):
        tokens += sum(len(d.token_ids) for d in llm.step())
    sync(dev)
    wall_s = time.perf_counter() - t0
    records = llm.clock.since(mark)
    host = compute_host_timing(records, wall_s)
    return Window(statistics.median(r.step_s for r in records) * 1e3, wall_s / plan.steps * 1e3, tokens / wall_s,
                  tokens / (B * plan.steps), host.host_ms_per_step_median, host.host_ms_per_step_p90)


# ---- the speculative step's parts, alone --------------------------------------------------------------------


@dataclass(frozen=True)
class Parts:
    verify_ms: float
    extend_ms: float  # late drafting's parts (nan when the step drafted early)
    chain_ms: float
    early_ms: float  # early drafting's one graph (nan when the step drafted late)

    @property
    def total_ms(self) -> float:
        draft = self.early_ms if math.isfinite(self.early_ms) else self.extend_ms + self.chain_ms
        return self.verify_ms + draft


@torch.inference_mode()
def time_parts(llm, repeats: int, early: bool) -> Parts:
    """The last step's verify graph and its draft, each alone: the early graph (early), or the last draft
    phase's extend (+ first pick) and chain graph (late)."""
    from m3bench.runtime.speculative.draft_step import run_draft

    spec, dev = llm.engine.spec, llm.device
    g, d = spec.graphs, spec.link.last
    verify = (lambda: g.run_verify(g.last_step)) if g.last_step is not None else None
    if early:
        ms = [median_ms(fn, dev, 2, repeats) for fn in (verify, g.replay_last_early)]
        return Parts(ms[0], math.nan, math.nan, ms[1])
    pick = lambda logits: (spec.draft.to_target_ids(logits.argmax(-1)), None)
    seen: list = []

    def stub_chain(tok, feature, tables, ends):  # the chain's inputs, kept; its output not computed
        seen[:] = [tok.clone(), feature.clone(), tables.clone(), ends.clone()]
        return tok[:, None].expand(-1, K - 1), None

    def extend():
        run_draft(spec.draft, spec.layout.store, spec.capture.buffer, d, K, pick, stub_chain)

    extend()
    chain = lambda: g.run_chain(*seen, d.ends_host, None)
    ms = [median_ms(fn, dev, 2, repeats) if fn is not None else float("nan") for fn in (verify, extend, chain)]
    return Parts(*ms, math.nan)


# ---- the table's rows ------------------------------------------------------------------------------------------


def spec_rows(plan: Plan, llm, layers: int) -> list[dict]:
    """Per batch, routing and AL: the speculative window and its parts."""
    from m3bench.runtime.speculative.synthetic import SyntheticAcceptance

    spec, rows = llm.engine.spec, []
    spec.link = RecordingLink()
    prime(llm, plan)
    for B in plan.batches:
        rids = start_requests(llm, plan, B)
        for routing in plan.routings:
            set_routing(llm.model, routing)
            for al, mode in itertools.product(plan.als, plan.drafts):
                spec.synth = SyntheticAcceptance(al, 0, llm.device)
                spec.early = mode == "early"
                rows.append({"layers": layers, "routing": routing.value, "al": al, "batch": B, "draft": mode,
                             **spec_row(plan, llm, B)})
                print(f"  spec L{layers} {routing.value} AL {al} B{B} {mode}: step "
                      f"{rows[-1]['spec']['step_ms']:.3f} ms", flush=True)
        stop_requests(llm, rids)
    return rows


def spec_row(plan: Plan, llm, B: int) -> dict:
    """The timed window of the running batch, the share of its steps that replayed the verify graph, its parts."""
    replays = llm.engine.spec.graphs.replays
    warm_up(llm, plan)
    before, early = replays["verify"], llm.engine.spec.early_steps
    w = timed_window(llm, plan, B)
    share = (replays["verify"] - before) / plan.steps
    early_share = (llm.engine.spec.early_steps - early) / plan.steps
    return {"graph_share": share, "early_share": early_share, "spec": asdict(w),
            "parts": asdict(time_parts(llm, plan.repeats, early_share > 0.5)),
            "experts_per_layer": verify_experts(llm)}


def verify_experts(llm) -> float:
    """Distinct local experts per MoE layer that the last verify step's tokens routed to (its forward rerun
    eagerly on the same inputs: the same KV and features written again)."""
    from m3bench.runtime.rank_step import target_logits

    spec = llm.engine.spec
    step = spec.graphs.last_step
    if step is None:
        return float("nan")
    return routing_stats(spec.model, lambda: target_logits(spec.model, spec.kv, step, spec.capture)).experts_per_layer


def plain_rows(plan: Plan, llm) -> dict[tuple[str, int], dict]:
    """(routing, batch) -> the plain window."""
    out = {}
    prime(llm, plan)
    for B in plan.batches:
        rids = start_requests(llm, plan, B)
        for routing in plan.routings:
            set_routing(llm.model, routing)
            warm_up(llm, plan)
            out[(routing.value, B)] = asdict(timed_window(llm, plan, B))
        stop_requests(llm, rids)
    return out


def with_plain(row: dict, plain: dict) -> dict:
    """The row's derived columns: overhead over its parts, predicted and achieved gain."""
    parts_ms = Parts(**row["parts"]).total_ms
    predicted = row["spec"]["tokens_per_request_step"] * plain["step_ms"] / parts_ms  # the AL the window landed
    achieved = row["spec"]["tok_s"] / plain["tok_s"]
    return {**row, "plain": plain, "parts_ms": parts_ms, "spec_over_parts": row["spec"]["step_ms"] / parts_ms,
            "predicted_gain": predicted, "achieved_gain": achieved, "achieved_over_predicted": achieved / predicted}


def measure_layers(plan: Plan, layers: int, dev: torch.device) -> list[dict]:
    model = build_model(plan, layers, dev)
    llm = build_llm(plan, model, draft_dir(model.cfg, plan.shapes, plan.cuda))
    rows = spec_rows(plan, llm, layers)
    del llm
    _free(dev)
    llm = build_llm(plan, model, None)
    plain = plain_rows(plan, llm)
    del llm, model
    _free(dev)
    return [with_plain(r, plain[(r["routing"], r["batch"])]) for r in rows]


def _free(dev: torch.device) -> None:
    gc.collect()  # (the engine's parts refer to each other: the block manager calls the runner back)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---- output -----------------------------------------------------------------------------------------------------

COLUMNS = ("L", "routing", "AL", "B", "draft", "experts", "spec ms", "verify ms", "extend ms", "chain ms", "early ms",
           "parts ms", "/parts",
           "plain ms", "pred x", "ach x", "ach/pred", "host p50", "host p90", "AL meas", "graph %")


def table(rows: list[dict]) -> str:
    lines = ["goals: /parts <= 1.1, ach/pred >= 0.9, host p50 at B64 <= 0.3 ms (* marks a miss)",
             " ".join(f"{c:>9}" for c in COLUMNS)]
    for r in rows:
        p, s = r["parts"], r["spec"]
        cells = [r["layers"], r["routing"], f"{r['al']:.1f}", r["batch"], r["draft"], f"{r['experts_per_layer']:.1f}",
                 f"{s['step_ms']:.3f}", *(_ms(p[k]) for k in ("verify_ms", "extend_ms", "chain_ms", "early_ms")),
                 f"{r['parts_ms']:.3f}",
                 _flag(r["spec_over_parts"], r["spec_over_parts"] <= 1.1), f"{r['plain']['step_ms']:.3f}",
                 f"{r['predicted_gain']:.2f}", f"{r['achieved_gain']:.2f}",
                 _flag(r["achieved_over_predicted"], r["achieved_over_predicted"] >= 0.9),
                 _flag(s["host_ms_p50"], r["batch"] != 64 or s["host_ms_p50"] <= 0.3), f"{s['host_ms_p90']:.3f}",
                 f"{s['tokens_per_request_step']:.2f}", f"{100 * r['graph_share']:.0f}"]
        lines.append(" ".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def _ms(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "-"


def _flag(x: float, ok: bool) -> str:
    return f"{x:.3f}{'' if ok else '*'}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny rank on CPU (the plumbing; the goals need a GPU)")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="default 12 47 (CPU: 2)")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 16 64 (CPU: 1 2)")
    ap.add_argument("--al", type=float, nargs="+", default=[2.8, 3.5], help="synthetic acceptance lengths")
    ap.add_argument("--routing", nargs="+", default=[Routing.ALL_LOCAL.value], choices=[r.value for r in Routing])
    ap.add_argument("--prompt-len", type=int, default=None, help="default 1024 (CPU: 24)")
    ap.add_argument("--steps", type=int, default=None, help="timed engine steps per row (default 24; CPU 3)")
    ap.add_argument("--repeats", type=int, default=10, help="replays of each part timed alone")
    ap.add_argument("--draft", nargs="+", default=["early"], choices=["early", "late"],
                    help="draft modes, each a window per row: early (before landing: the default) and/or late")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here too (default $OUT/spec_overhead.json)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    """Exit 0 once the table is printed (the goals are read off it), 2 without a GPU (and no --cpu-smoke)."""
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-smoke)", file=sys.stderr)
        return 2
    plan = plan_of(args)
    dev = torch.device("cuda" if plan.cuda else "cpu")
    out = args.json or (Path(os.environ["OUT"]) / "spec_overhead.json" if os.environ.get("OUT") else None)
    t0, rows = time.perf_counter(), []
    for layers in plan.layers:  # each depth's table and rows as soon as they exist: a cut-off run keeps them
        rows += measure_layers(plan, layers, dev)
        print(f"{layers} layers done ({time.perf_counter() - t0:.0f} s)", flush=True)
        print(table(rows), flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
