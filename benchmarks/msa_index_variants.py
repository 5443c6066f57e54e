"""The MSA indexer (block scores + top-k) of one TP8 rank (index head of 128, page 128, top-16) on the same inputs:
this tree's kernel in its variants (the NVFP4 decode register cap, pipeline stages), FP8 and NVFP4 index keys,
decode at batch 32 and contexts 32k / 128k, plus prefill chunks (B1, ctx 32k, 2048 tokens; also bf16 keys); with
--baseline, the same calls from another checkout (e.g. the commit before) in a subprocess. Every variant's
selections must equal the first one's, and the baseline's.

    python benchmarks/msa_index_variants.py                        # this tree (H200: ~40 s)
    git worktree add /tmp/m3-base 293e21c
    python benchmarks/msa_index_variants.py --baseline /tmp/m3-base
    TRITON_INTERPRET=1 python benchmarks/msa_index_variants.py --tiny   # CPU smoke run

Timing as benchmarks/kernels_gpu.py: median over CUDA-graph replays of calls on distinct inputs (cold L2);
compilation and warm-up outside the timed graphs. Exit code: 0 selections identical, 1 not, 2 no GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

GOAL_RATIO = 1.1


@dataclass(frozen=True)
class Case:
    name: str
    fmt: str
    batch: int
    ctx: int
    q_len: int


@dataclass(frozen=True)
class Variant:
    """Knobs of this tree's launcher (m3bench.runtime.kernels.msa_index): NVFP4_DECODE_MAX_REGS, SCORE_STAGES."""

    name: str
    max_regs: int | None
    stages: int


VARIANTS = (Variant("cap96-s2", 96, 2), Variant("nocap-s2", None, 2), Variant("cap88-s2", 88, 2),
            Variant("cap96-s3", 96, 3), Variant("nocap-s3", None, 3))
BASELINE = Variant("baseline", None, 0)


def make_cases(tiny: bool) -> list[Case]:
    """Grouped by key format: one pool of index keys in memory at a time."""
    if tiny:
        return [Case("decode", "fp8", 2, 300, 1), Case("decode", "nvfp4", 2, 300, 1),
                Case("prefill", "nvfp4", 1, 300, 40)]
    decode = {f: [Case("decode", f, 32, ctx, 1) for ctx in (32768, 131072)] for f in ("fp8", "nvfp4")}
    prefill = {f: [Case("prefill", f, 1, 32768, 2048)] for f in ("bf16", "fp8", "nvfp4")}
    return [c for f in ("bf16", "fp8", "nvfp4") for c in decode.get(f, []) + prefill[f]]


def import_tree(tree: Path | None):
    """kernels_gpu and m3bench, m3bench from tree when given (imported first, so kernels_gpu reuses it)."""
    if tree is not None:
        sys.path.insert(0, str(tree))
        import m3bench.runtime.kernels.msa_index  # noqa: F401  (the baseline's package, cached for kernels_gpu)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels_gpu
    import m3bench
    print(f"m3bench from {Path(m3bench.__file__).parent}", file=sys.stderr)
    return kernels_gpu


def apply(variant: Variant) -> None:
    """Sets this tree's launcher knobs (a baseline tree has none: BASELINE leaves it alone)."""
    if variant is BASELINE:
        return
    from m3bench.runtime.kernels import msa_index
    msa_index.NVFP4_DECODE_MAX_REGS = variant.max_regs
    msa_index.SCORE_STAGES = variant.stages


def case_calls(kg, case: Case, seed: int, sh, dev, pools: dict) -> tuple[list, list]:
    """(calls on distinct inputs, the batches) for one case; inputs from a generator seeded by the case."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    bytes_per_call = kg.index_bytes(case.fmt, case.batch, case.batch * case.q_len, case.ctx, sh)
    batches = [kg.make_batch(pools[case.fmt], [case.ctx] * case.batch, [case.q_len] * case.batch, sh, dev, gen)
               for _ in range(kg.n_copies(bytes_per_call))]
    outs = [kg.run_select(pools[case.fmt], bt, sh) for bt in batches]
    calls = [lambda bt=bt, o=o: kg.run_select(pools[case.fmt], bt, sh, out=o) for bt, o in zip(batches, outs)]
    return calls, batches


def run_tree(kg, cases: list[Case], variants: tuple[Variant, ...], tiny: bool) -> tuple[dict, dict]:
    """{(case, variant): us}, {case: selections of its first input} (one per variant, checked equal)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sh = replace(kg.TINY, page=128) if tiny else kg.Shapes()
    times, sels, pools = {}, {}, {}
    for seed, case in enumerate(cases):
        if case.fmt not in pools:
            n_pages = max(c.batch * math.ceil(c.ctx / sh.page) for c in cases if c.fmt == case.fmt) + 8
            gen = torch.Generator(device=dev).manual_seed(1)
            pools = {case.fmt: make_pool(kg, case.fmt, n_pages, sh, dev, gen)}  # one pool in memory at a time
        calls, batches = case_calls(kg, case, 100 + seed, sh, dev, pools)
        for variant in variants:
            apply(variant)
            sel = kg.run_select(pools[case.fmt], batches[0], sh).cpu()
            if case in sels and not torch.equal(sels[case], sel):
                raise SelectionMismatch(f"{case} {variant.name}: selections differ from the first variant's")
            sels.setdefault(case, sel)
            times[(case, variant.name)] = kg.time_us(calls)
            print(f"  {case.name} {case.fmt} B{case.batch} ctx{case.ctx} q{case.q_len} {variant.name}: "
                  f"{times[(case, variant.name)]:.1f} us", file=sys.stderr, flush=True)
    return times, sels


def make_pool(kg, fmt: str, n_pages: int, sh, dev, gen):
    """Index keys only (the indexer reads no K / V)."""
    ik = kg.store_as(torch.randn(n_pages, sh.page, sh.di, device=dev, generator=gen, dtype=torch.bfloat16), fmt)
    return kg.Pool(None, None, ik, n_pages)


class SelectionMismatch(Exception):
    pass


def table(times: dict, cases: list[Case], names: list[str]) -> str:
    lines = [f"{'case':8} {'fmt':6} {'B':>3} {'ctx':>7} {'q':>5} " + " ".join(f"{n:>10}" for n in names)]
    for c in cases:
        row = [times.get((c, n)) for n in names]
        lines.append(f"{c.name:8} {c.fmt:6} {c.batch:3d} {c.ctx:7d} {c.q_len:5d} "
                     + " ".join(f"{t:10.1f}" if t is not None else f"{'-':>10}" for t in row))
    for ctx in sorted({c.ctx for c in cases if c.name == "decode"}):
        by = {c.fmt: c for c in cases if c.name == "decode" and c.ctx == ctx}
        if {"fp8", "nvfp4"} <= by.keys():
            ratios = [times.get((by["nvfp4"], n), math.nan) / times.get((by["fp8"], n), math.nan) for n in names]
            lines.append(f"decode ctx {ctx} nvfp4 / fp8 (goal <= {GOAL_RATIO}): "
                         + " ".join(f"{n} {r:.2f}" for n, r in zip(names, ratios)))
    return "\n".join(lines)


def run_baseline(tree: Path, tiny: bool) -> tuple[dict, dict]:
    """This script in a subprocess with tree's m3bench: its times and selections (through a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "baseline.pt"
        cmd = [sys.executable, __file__, "--as-baseline", str(tree), "--dump", str(out)] + (["--tiny"] if tiny else [])
        subprocess.run(cmd, check=True, env=os.environ.copy())
        return torch.load(out, weights_only=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout's root: its indexer timed on the same inputs")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    ap.add_argument("--as-baseline", type=Path, help=argparse.SUPPRESS)  # the subprocess of --baseline
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("no CUDA device: run with --tiny (and TRITON_INTERPRET=1) for a CPU smoke run", file=sys.stderr)
        return 2
    cases = make_cases(args.tiny)
    if args.as_baseline:
        kg = import_tree(args.as_baseline)
        torch.save(run_tree(kg, cases, (BASELINE,), args.tiny), args.dump)
        return 0
    base_times, base_sels = run_baseline(args.baseline, args.tiny) if args.baseline else ({}, {})
    kg = import_tree(None)
    try:
        times, sels = run_tree(kg, cases, VARIANTS, args.tiny)
    except SelectionMismatch as exc:
        print(f"FAILED: {exc}")
        return 1
    differ = [c for c in base_sels if not torch.equal(base_sels[c], sels[c])]
    names = ([BASELINE.name] if base_times else []) + [v.name for v in VARIANTS]
    print(table(times | base_times, cases, names))
    if base_sels:
        print("selections vs baseline: " + ("identical" if not differ else f"DIFFER in {differ}"))
    return 1 if differ else 0


if __name__ == "__main__":
    if "--tiny" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
