"""Old against new decode top-k kernels on the GPU: the same selections, then us per call.

    python benchmarks/topk_speed.py                 # H200: checks, then the table (~20 s)
    python benchmarks/topk_speed.py --json out.json
    python benchmarks/topk_speed.py --warps 1 2 4 8   # also the new kernels at each of these warp counts
    TRITON_INTERPRET=1 python benchmarks/topk_speed.py --tiny   # CPU smoke run, tiny shapes

Kernels (one TP8/EP8 rank of MiniMax-M3): "msa-topk", the MSA indexer's top-16 of one index head's
block scores (msa_index.select_top_blocks) at 64 valid blocks (8k context) and 1024 (128k), with the
row as wide as its blocks and, for 8k, inside a 1024-wide row (a CUDA-graph decode step's block table
at a 128k model length). (A rewrite of the router's top-k + alignment in the same style computed wrong
alignments on the H200 from 2 tokens on, with Triton 3.6, while the interpreter agreed: not kept.)
"old" is the kernel before the rank / packed-key rewrite (benchmarks/topk_baseline_triton.py).
Checks first, on the same inputs: new == old (ids exactly) and the ids == a stable sort of the scores; scores hold ties, +inf (local block), 3e38 (init block)
and -inf entries. Each timing is the median over CUDA-graph replays of Shapes.calls calls on distinct inputs
(kernels_gpu.time_us), compiled and warmed up outside the timed window.
Exit code: 0 every check passed, 1 a check failed, 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from kernels_gpu import time_us

from m3bench.runtime.kernels.msa_index import select_top_blocks

INIT_SCORE = 3.0e38  # msa_index_triton's init-block score


@dataclass(frozen=True)
class Shapes:
    page: int = 128
    topk: int = 16
    msa_batches: tuple[int, ...] = (1, 4, 16, 64)
    msa_rows: tuple[tuple[int, int], ...] = ((64, 64), (64, 1024), (1024, 1024))  # (valid blocks, row width)
    experts: int = 128
    top_k: int = 4
    n_local: int = 16
    block_m: int = 16
    router_tokens: tuple[int, ...] = (1, 4, 16)
    plain_router_tokens: int = 64
    calls: int = 16  # distinct inputs a timed graph, every one checked


TINY = Shapes(page=16, topk=4, msa_batches=(1, 3), msa_rows=((10, 16), (10, 40), (40, 40)), experts=16, top_k=2,
              n_local=4, block_m=4, router_tokens=(1, 6), plain_router_tokens=9, calls=2)


@dataclass(frozen=True)
class Row:
    kernel: str
    batch: int
    blocks: int  # msa-topk: valid blocks a row; router: experts
    width: int  # msa-topk: the score row's width; router: local experts
    same: bool
    old_us: float
    new_us: float
    warps: int | None = None  # the new kernel's warps when not its rule's (--warps)

    @property
    def speedup(self) -> float:
        return self.old_us / self.new_us


def old_new_us(call, old, new, inputs: list, sh: Shapes) -> tuple[float, float]:
    """us per call(fn, x, sh) of the old and the new kernel, each over all the inputs in one graph."""
    return tuple(time_us([partial(call, fn, x, sh) for x in inputs]) for fn in (old, new))


# ---------------------------------------------------------------- MSA top-k

def msa_scores(batch: int, n_valid: int, width: int, sh: Shapes, dev, gen) -> tuple[torch.Tensor, ...]:
    """(scores [B, 1, width], seq_lens, qsl, out) of B decode tokens with n_valid blocks each: scores on a
    0.05 grid (ties), the local block +inf, block 0 an init block, every 7th row's block 1 -inf, the rest
    of the row (past n_valid) garbage that must not be picked; out made here, outside the timed calls."""
    scores = torch.randn(batch, 1, width, device=dev, generator=gen).mul(20).round().div(20)
    scores[:, :, n_valid:] = 1e30
    scores[:, :, n_valid - 1] = float("inf")
    scores[:, :, 0] = INIT_SCORE
    scores[::7, :, 1] = float("-inf")
    seq_lens = torch.full((batch,), (n_valid - 1) * sh.page + 1, dtype=torch.int32, device=dev)
    out = torch.full((batch, 1, sh.topk), -7, dtype=torch.int32, device=dev)
    return scores, seq_lens, torch.arange(batch + 1, dtype=torch.int32, device=dev), out


def msa_select(fn, inputs, sh: Shapes) -> torch.Tensor:
    scores, seq_lens, qsl, out = inputs
    fn(scores, out, sh.page, seq_lens, qsl, sh.topk, 1)
    return out


def msa_reference(scores: torch.Tensor, n_valid: int, topk: int) -> torch.Tensor:
    """The selection's contract: (score desc, block id asc) over the valid blocks, -1 padded."""
    ids = torch.sort(scores[:, :, :n_valid].cpu(), dim=-1, descending=True, stable=True).indices[..., :topk]
    return torch.cat([ids.int(), torch.full((*ids.shape[:2], topk - ids.shape[-1]), -1, dtype=torch.int32)], -1)


def msa_row(batch: int, n_valid: int, width: int, sh: Shapes, dev, gen, warps: int | None = None) -> Row:
    from topk_baseline_triton import select_top_blocks_v0

    new = partial(select_top_blocks, num_warps=warps)
    inputs = [msa_scores(batch, n_valid, width, sh, dev, gen) for _ in range(sh.calls)]
    same = all(torch.equal(msa_select(new, x, sh).clone(), msa_select(select_top_blocks_v0, x, sh))
               and torch.equal(x[3].cpu(), msa_reference(x[0], n_valid, sh.topk)) for x in inputs)
    return Row("msa-topk", batch, n_valid, width, same, *old_new_us(msa_select, select_top_blocks_v0, new, inputs, sh),
               warps)


# ---------------------------------------------------------------- run

def run(sh: Shapes, dev, gen, warps: tuple[int, ...] = ()) -> list[Row]:
    """Every case with the kernel's own warps, then (warps) the new MSA top-k at others."""
    rows = [msa_row(b, n, w, sh, dev, gen) for n, w in sh.msa_rows for b in sh.msa_batches]
    return rows + [msa_row(b, n, w, sh, dev, gen, nw) for nw in warps for n, w in sh.msa_rows for b in sh.msa_batches]


def print_table(rows: list[Row]) -> None:
    print(f"{'kernel':<13}{'batch':>6}{'blocks':>7}{'width':>6}  {'same':<5}{'old us':>9}{'new us':>9}{'speed-up':>9}"
          f"{'warps':>7}")
    for r in rows:
        print(f"{r.kernel:<13}{r.batch:>6}{r.blocks:>7}{r.width:>6}  {'yes' if r.same else 'NO':<5}"
              f"{r.old_us:>9.2f}{r.new_us:>9.2f}{r.speedup:>8.2f}x{r.warps or 'rule':>7}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    p.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    p.add_argument("--warps", type=int, nargs="*", default=[],
                   help="also time the new MSA top-k and aligning router at each of these warp counts")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("no CUDA device: run on the H200 (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    sh = TINY if args.tiny else Shapes()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = run(sh, dev, torch.Generator(device=dev).manual_seed(0), tuple(args.warps))
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"speedup": r.speedup} for r in rows], indent=1))
    bad = [f"{r.kernel} B{r.batch} {r.blocks}/{r.width}" for r in rows if not r.same]
    print(f"checks: {len(rows) - len(bad)}/{len(rows)} new == old{' FAILED: ' + ', '.join(bad) if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    if "--tiny" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
