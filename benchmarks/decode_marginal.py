"""What each kernel of the rank's decode step costs where it runs: the CUDA-graph-replayed step with one kind of
kernel launched twice, or not at all, against the step as it is.

    python benchmarks/decode_marginal.py --budget-gb 66          # H100: 37 layers; H200: 60 (no --budget-gb)
    python benchmarks/decode_marginal.py --batches 1 4 --ops-set skinny-pdl-side-whole-split
    python benchmarks/decode_marginal.py --mode removed          # each pure kind left out of the step

A profile sums each kernel's own time, which under PDL also holds its wait for the kernel before it, and misses the
gaps between launches (performance.md 2g: 68 us of kernels in a 80 us layer; the kernels it showed as slow sped up
alone without moving the step, 2h). Here every call of one kind of kernel runs twice in a row (the same inputs and
outputs: each is a pure function of its inputs or rewrites the same values), so the step computes the same bits
(checked) and takes longer by what one more such launch costs in the chain, its launch and its wait included:
(doubled - base) / calls. That is the time a fusion removing the kernel could save at most (and a faster kernel
gains at most its share of it). One caveat: the second call finds in L2 what the first read, so for a GEMM whose
weights fit the L2 (q|k|v 23.6 MB, o_proj 12.6 MB of 50 MB) the figure is a lower bound of its cold cost. Kinds: the residual add + norm, the norm / RoPE / cache write, the MSA index
(block scores + top-k), attention (+ split-KV combine), the plain GEMMs by role (q|k|v(|index), o_proj, the fp32
router, the shared expert's gate|up and down, the dense MLP's), the router's top-k + alignment, and the routed
experts (gate|up, down, sum). Where the attention selects the blocks and the experts' gate|up routes one token (the
runtime's set since performance.md 2t), the MSA index is its scores launch alone and a B1 step has no router top-k.
Rows: the realistic routing's first draw and all-local, per batch. Same rank and shapes as decode_step.py (its
build_rank).

`--mode removed` answers the other question, what the step saves if a kind's launches cost nothing: every call of a
pure kind (one that only returns new tensors: the GEMMs, the MSA index, attention, the router's top-k + align, the
routed experts; and the shared expert's two GEMMs together, which empties the side lane) returns the result its call
made in an eager run before the capture, so the graph holds no launch of it and the step computes the same bits
(checked): (base - removed) / calls. A kind whose chain runs beside a longer one (the side lane) saves little; one
on the critical path saves its whole cost there. The in-place kinds (add + norm, norm / RoPE / write) are not removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from decode_routing import Routing, set_routing
from decode_setup import OpsSet, decode_meta, graphed, median_ms, pdl_mode, set_ops
from decode_step import _base_plan, build_rank, draw_ids, parse_args as step_args

from m3bench.runtime.attention import triton_backend
from m3bench.runtime.layers import attention, linear, mlp, moe, norm

# (kind, module, function names): every call of the function through that module runs twice
SITES = {
    "add + norm": (norm, ("add_rms_norm_fused",)),
    "norm / RoPE / write": (attention, ("norm_rope_write", "norm_rope_write_pair")),
    "MSA index (scores + top-k)": (triton_backend, ("msa_select_blocks", "msa_block_scores")),  # scores alone where
    #                                                                   the attention selects (SELECT_IN_ATTENTION)
    "attention (+ combine)": (triton_backend, ("paged_attention",)),
    "router top-k + align": (moe, ("router_topk_align",)),
    "routed experts": (moe, ("fused_moe",)),
}
GEMMS = ("q|k|v(|index)", "o_proj", "router GEMV", "shared gate|up", "shared down", "dense MLP")
SHARED = "shared expert (both GEMMs)"
IN_PLACE = ("add + norm", "norm / RoPE / write")  # they write what they were given: not removed
ROLES = {SHARED: ("shared gate|up", "shared down")}  # a removed kind of several GEMM roles


def gemm_role(x: torch.Tensor, weight: torch.Tensor, gate) -> str:
    """A plain GEMM's role in the rank from its weight (decode_floor.RANK's shapes)."""
    n, k = weight.shape
    if weight.dtype == torch.float32:
        return "router GEMV"
    if gate is not None:
        return "shared gate|up" if n <= 1024 else "dense MLP"
    if k == 1024:
        return "o_proj"
    if n < 6144 and k == 6144:
        return "q|k|v(|index)"
    return "shared down" if k <= 512 else "dense MLP"


@contextmanager
def doubled(kind: str, counter: list):
    """Inside: every call of `kind` runs twice (counted in counter[0], once a call)."""
    with _patched(kind, lambda fn, this: _twice(fn, counter, this)):
        yield


@contextmanager
def removed(kind: str, counter: list, cache: Replay):
    """Inside: every call of the pure `kind` (not IN_PLACE) returns cache's result for it: recorded from the real
    call while cache.recording, then replayed in call order with no launch (an `add` callable is still called: the
    routed experts' join of the side lane). counter[0] counts the calls."""
    if kind in IN_PLACE:
        raise ValueError(f"{kind} writes in place: it cannot be removed")
    with _patched(kind, lambda fn, this: cache.wrap(fn, counter, this)):
        yield


@contextmanager
def _patched(kind: str, wrap):
    """Inside: the functions a kind's calls go through replaced by wrap(fn, this), `this(args, kwargs)` telling a call
    of the kind from others through the same function (the GEMMs: skinny_linear by role); restored after."""
    patched = []
    if kind in SITES:
        mod, names = SITES[kind]
        for name in names:
            patched.append((mod, name, getattr(mod, name)))
            setattr(mod, name, wrap(getattr(mod, name), lambda a, kw: True))
    else:
        roles = ROLES.get(kind, (kind,))
        for mod in (linear, mlp):
            fn = mod.skinny_linear
            patched.append((mod, "skinny_linear", fn))
            mod.skinny_linear = wrap(fn, lambda a, kw: gemm_role(a[0], a[1], kw.get("gate")) in roles)
    try:
        yield
    finally:
        for mod, name, fn in patched:
            setattr(mod, name, fn)


class Replay:
    """The results of one step's calls of a kind: recorded (copies, so later launches cannot overwrite them), then
    handed back in the same order each step (`restart` before a step)."""

    def __init__(self):
        self.recording, self.results, self.cursor = True, [], 0

    def restart(self) -> None:
        self.cursor = 0

    def wrap(self, fn, counter: list, this=lambda a, kw: True):
        def run(*a, **kw):
            if not this(a, kw):
                return fn(*a, **kw)
            counter[0] += 1
            if self.recording:
                self.results.append(_copied(fn(*a, **kw)))
                return self.results[-1]
            add = kw.get("add")
            if callable(add):
                add()
            out, self.cursor = self.results[self.cursor], self.cursor + 1
            return out
        return run


def _copied(result):
    """result with every tensor in it (in tuples and dataclasses too) cloned."""
    if isinstance(result, torch.Tensor):
        return result.clone()
    if isinstance(result, tuple):
        return tuple(_copied(r) for r in result)
    if dataclasses.is_dataclass(result):
        return dataclasses.replace(result, **{f.name: _copied(getattr(result, f.name))
                                              for f in dataclasses.fields(result)
                                              if isinstance(getattr(result, f.name), (torch.Tensor, tuple))})
    return result


def _twice(fn, counter: list, this=lambda a, kw: True):
    def run(*a, **kw):
        if this(a, kw):
            counter[0] += 1
            fn(*a, **kw)
        return fn(*a, **kw)
    return run


@torch.inference_mode()
def marginal_rows(model, kv, plan, B: int, routing: Routing, dev, layers: int, mode: str = "doubled") -> list[dict]:
    """One row a kind: the step with its calls doubled (mode "doubled") or left out ("removed"), against the base."""
    s = plan.shapes
    meta, ids = decode_meta(s, B, plan.contexts[0], dev), draw_ids(s.vocab, B, plan.contexts[0], 0).to(dev)
    out = torch.empty(B, s.vocab, dtype=torch.float32, device=dev)
    cache = Replay()

    def step():
        cache.restart()
        out.copy_(model.compute_logits(model(ids, meta.positions, meta, kv)))

    set_routing(model, routing)
    run, _ = graphed(step, dev)
    base_ms, want = median_ms(run, dev, plan.warmup, plan.repeats), out.clone()
    del run
    rows = []
    for kind in kinds(mode):
        counter, cache = [0], Replay()
        with doubled(kind, counter) if mode == "doubled" else removed(kind, counter, cache):
            step()  # eager once: count the calls a step makes (and record their results)
            calls, counter[0], cache.recording = counter[0], 0, False
            run, _ = graphed(step, dev)
            ms = median_ms(run, dev, plan.warmup, plan.repeats)
            same = bool(torch.equal(out, want))
            del run
        us = ((ms - base_ms) if mode == "doubled" else (base_ms - ms)) * 1e3 / calls if calls else float("nan")
        rows.append({"batch": B, "routing": routing.value, "kind": kind, "mode": mode, "calls": calls,
                     "base_ms": base_ms, f"{mode}_ms": ms, "us_per_call": us, "us_per_layer": us * calls / layers,
                     "same_bits": same})
        sign = "+" if mode == "doubled" else "-"
        print(f"  B={B} {routing.value:<9} {kind:<26} calls {calls:4d}  base {base_ms:7.3f} ms  {mode} {ms:7.3f} ms"
              f"  {sign}{us:6.2f} us a call  {us * calls / layers:6.2f} us a layer{'' if same else '  BITS DIFFER'}",
              flush=True)
    return rows


def kinds(mode: str) -> tuple[str, ...]:
    """The kinds a mode measures: all, doubled; the pure ones and the shared expert's pair, removed."""
    if mode == "doubled":
        return (*SITES, *GEMMS)
    return tuple(k for k in (*SITES, *GEMMS, SHARED) if k not in IN_PLACE)


def table(rows: list[dict], layers: int) -> str:
    what = ("what one more launch costs" if rows and rows[0]["mode"] == "doubled"
            else "what the step saves without the kind's launches")
    lines = [f"{what} in the replayed step ({layers} layers): us a call (us a layer)",
             f"{'kind':<28}" + "".join(f"{'B=' + str(b) + ' ' + r:>24}" for b, r in _cols(rows))]
    for kind in dict.fromkeys(r["kind"] for r in rows):
        cells = [next(r for r in rows if r["kind"] == kind and (r["batch"], r["routing"]) == c) for c in _cols(rows)]
        lines.append(f"{kind:<28}" + "".join(f"{c['us_per_call']:>13.2f} ({c['us_per_layer']:6.2f})" for c in cells))
    return "\n".join(lines)


def _cols(rows):
    return list(dict.fromkeys((r["batch"], r["routing"]) for r in rows))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--budget-gb", type=float, default=None, help="as decode_step.py (H100: 66)")
    ap.add_argument("--ops-set", default=OpsSet.runtime().value, choices=[o.value for o in OpsSet])
    ap.add_argument("--mode", default="doubled", choices=["doubled", "removed"],
                    help="each kind's calls run twice (what one more costs) or not at all (what removing it saves)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: run on the H200 / H100", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    step = step_args(["--batches", *map(str, args.batches), "--contexts", str(args.context)]
                     + (["--budget-gb", str(args.budget_gb)] if args.budget_gb else []))
    plan = replace(_base_plan(step), batches=tuple(args.batches), contexts=(args.context,))
    model, kv = build_rank(plan, dev)
    rows = []
    with pdl_mode():
        set_ops(model, OpsSet(args.ops_set))
        for B in plan.batches:
            for routing in (Routing.REALISTIC, Routing.ALL_LOCAL):
                rows += marginal_rows(model, kv, plan, B, routing, dev, plan.layers, args.mode)
    print(table(rows, plan.layers))
    if os.environ.get("OUT"):
        name = "decode_marginal.json" if args.mode == "doubled" else "decode_removed.json"
        (Path(os.environ["OUT"]) / name).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
