"""GPU check and benchmark of the runtime's Triton kernels at MiniMax-M3 per-GPU TP8 shapes.

    python benchmarks/kernels_gpu.py              # H200: checks, then timings; table last (< 5 min)
    python benchmarks/kernels_gpu.py --json out.json
    TRITON_INTERPRET=1 python benchmarks/kernels_gpu.py --tiny   # CPU smoke run, tiny shapes

Shapes (TP8 of M3): 8 query heads, 1 KV head, head_dim 128, one index head of 128, page 128,
top-16 blocks; MoE hidden 6144: "moe-ep" 16 local experts of 3072, top-4 over 128 experts
(only the local ones count); "moe-local" the same with every pick local; "moe-tp" 128 experts
of 384 (TP8 split of 3072), top-4 over 128 (the layout of runtime/layers/moe.py).
Every kernel is first compared with its torch reference (fp32) on fresh random data; each
timing is the median over CUDA-graph replays of many calls on distinct inputs (a replay streams
more than 3x the L2, so every call reads cold data), per call; warm-up and compilation outside the
timed window; without a capturable graph plain launches are timed (and a note printed). Achieved bandwidth counts
the bytes each kernel must move (see *_bytes) against the floor's bandwidth (decode_floor.peak_bytes_per_s: the
device's copy rate, measured at the start of a GPU run, floor_bandwidth.py).
Exit code: 0 all checks passed, 1 a check failed, 2 no GPU (without --tiny).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # decode_floor, floor_bandwidth

import torch
from decode_floor import peak_bytes_per_s
from floor_bandwidth import use_device_bandwidth

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.kv_write import write_pages, write_pages_ref
from m3bench.runtime.kernels.moe import MoeActivation, MoeTiles, fused_moe
from m3bench.runtime.kernels.msa_index import msa_select_blocks
from m3bench.runtime.kernels.reference import (
    fused_moe_ref,
    msa_block_scores_ref,
    msa_select_blocks_ref,
    paged_attention_ref,
)

TRITON = KernelBackend.TRITON


@dataclass(frozen=True)
class Shapes:
    hq: int = 8
    hkv: int = 1
    d: int = 128
    di: int = 128
    page: int = 128
    topk: int = 16
    hidden: int = 6144
    n_local: int = 16
    inter: int = 3072
    tp_inter: int = 384  # 3072 / 8
    top_k: int = 4
    n_routed: int = 128
    batches: tuple[int, ...] = (1, 4, 16, 64)
    contexts: tuple[int, ...] = (1024, 8192, 32768)
    chunk: int = 4  # query tokens of a verify chunk (1 + draft length 3)


TINY = Shapes(hq=4, hkv=1, d=32, di=32, page=16, topk=4, hidden=64, n_local=4, inter=48,
              tp_inter=16, top_k=2, n_routed=8, batches=(1, 2), contexts=(40, 100), chunk=3)


@dataclass(frozen=True)
class Check:
    name: str
    err: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.err <= self.tol


@dataclass(frozen=True)
class Timing:
    kernel: str
    fmt: str
    batch: int
    ctx: int
    q_len: int
    us: float
    bytes_moved: int

    @property
    def tb_per_s(self) -> float:
        return self.bytes_moved / (self.us * 1e-6) / 1e12

    @property
    def pct_peak(self) -> float:
        return 100.0 * self.tb_per_s * 1e12 / peak_bytes_per_s()


# ---------------------------------------------------------------- inputs

def kv_bytes_per_token(fmt: str, d: int) -> float:
    """Bytes of one token of one head: bf16 2d, fp8 d, nvfp4 d/2 data + d/16 scales."""
    return {"bf16": 2 * d, "fp8": d, "nvfp4": d / 2 + d / 16}[fmt]


def store_as(x: torch.Tensor, fmt: str) -> kq.PagedTensor:
    if fmt == "fp8":
        return kq.quantize_fp8(x)
    if fmt == "nvfp4":
        gs = kq.nvfp4_global_scale(x.abs().amax()).reshape(1).to(x.device)
        return kq.Nvfp4Pages(*kq.quantize_nvfp4(x, gs), gs)
    return x.to(torch.bfloat16)


@dataclass(frozen=True)
class Pool:
    k: kq.PagedTensor
    v: kq.PagedTensor
    ik: kq.PagedTensor
    n_pages: int


def make_pool(fmt: str, n_pages: int, sh: Shapes, dev, gen) -> Pool:
    """One page pool per KV format; the index keys use fp8 when fmt is fp8, else bf16."""
    def rnd(*s):
        return torch.randn(*s, device=dev, generator=gen, dtype=torch.bfloat16)
    k = store_as(rnd(n_pages, sh.hkv, sh.page, sh.d), fmt)
    v = store_as(rnd(n_pages, sh.hkv, sh.page, sh.d), fmt)
    ik = store_as(rnd(n_pages, sh.page, sh.di), "fp8" if fmt == "fp8" else "bf16")
    return Pool(k, v, ik, n_pages)


@dataclass(frozen=True)
class Batch:
    q: torch.Tensor
    iq: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    qsl: torch.Tensor
    max_q: int


def make_batch(pool: Pool, seq_lens: list[int], q_lens: list[int], sh: Shapes, dev, gen) -> Batch:
    """Requests on random distinct pages of the pool; q and iq of unit RMS like normed ones."""
    n_pages = [math.ceil(n / sh.page) for n in seq_lens]
    perm = torch.randperm(pool.n_pages, device=dev, generator=gen)[: sum(n_pages)].to(torch.int32)
    tables = torch.zeros((len(seq_lens), max(n_pages)), dtype=torch.int32, device=dev)
    offsets = [0, *torch.tensor(n_pages).cumsum(0).tolist()]
    for b, n in enumerate(n_pages):
        tables[b, :n] = perm[offsets[b]:offsets[b] + n]
    n_tok = sum(q_lens)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    return Batch(
        q=torch.randn(n_tok, sh.hq, sh.d, device=dev, generator=gen, dtype=torch.bfloat16),
        iq=torch.randn(n_tok, sh.hkv, sh.di, device=dev, generator=gen, dtype=torch.bfloat16),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        qsl=qsl,
        max_q=max(q_lens),
    )


# ---------------------------------------------------------------- kernels under test

def run_attention(pool: Pool, bt: Batch, sh: Shapes, sel=None, out=None, tile=None):
    return paged_attention(bt.q, pool.k, pool.v, bt.block_tables, bt.seq_lens, bt.qsl,
                           sh.d ** -0.5, selected_blocks=sel, out=out, max_query_len=bt.max_q,
                           backend=TRITON, tile=tile)


def run_select(pool: Pool, bt: Batch, sh: Shapes, out=None):
    return msa_select_blocks(bt.iq, pool.ik, bt.block_tables, bt.seq_lens, bt.qsl, sh.topk,
                             out=out, max_query_len=bt.max_q, backend=TRITON)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-12))


def check_attention(pool: Pool, bt: Batch, sh: Shapes, fmt: str, sel=None) -> Check:
    got = run_attention(pool, bt, sh, sel)
    want = paged_attention_ref(bt.q.float(), pool.k, pool.v, bt.block_tables, bt.seq_lens,
                               bt.qsl, sh.d ** -0.5, sel)
    kind = "msa-attn" if sel is not None else "attn"
    return Check(f"{kind} {fmt} q_len<={bt.max_q}", rel_err(got, want), 2e-2)


def check_write(pool: Pool, sh: Shapes, fmt: str, dev, gen) -> Check:
    """Triton KV write vs the torch writer on a copy of the pool: identical bytes (err = share differing)."""
    n_tok = 64
    x = torch.randn(n_tok, sh.hkv, sh.d, device=dev, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(pool.n_pages * sh.page, device=dev, generator=gen)[:n_tok]
    got, want = _copy(pool.k), _copy(pool.k)
    write_pages(got, x, slots, backend=TRITON)
    write_pages_ref(want, x, slots)
    diff = (_raw_bytes(got) != _raw_bytes(want)).float().mean()
    return Check(f"kv-write {fmt} T={n_tok}", float(diff), 0.0)


def _copy(cache):
    if isinstance(cache, kq.Nvfp4Pages):
        return kq.Nvfp4Pages(cache.data.clone(), cache.scales.clone(), cache.global_scale)
    return cache.clone()


def _raw_bytes(cache) -> torch.Tensor:
    if isinstance(cache, kq.Nvfp4Pages):
        return torch.cat([cache.data.flatten(), cache.scales.view(torch.uint8).flatten()])
    return cache.flatten().view(torch.uint8)


def check_sparse(pool: Pool, bt: Batch, sh: Shapes, fmt: str) -> Check:
    return check_attention(pool, bt, sh, fmt, sel=run_select(pool, bt, sh))


def check_select(pool: Pool, bt: Batch, sh: Shapes, fmt: str) -> Check:
    """Selections may differ only on near-ties: compare the reference scores of the chosen sets."""
    got = run_select(pool, bt, sh)
    want = msa_select_blocks_ref(bt.iq.float(), pool.ik, bt.block_tables, bt.seq_lens, bt.qsl, sh.topk)
    scores = msa_block_scores_ref(bt.iq.float(), pool.ik, bt.block_tables, bt.seq_lens, bt.qsl)
    def chosen(ids):
        s = torch.gather(scores, -1, ids.clamp_min(0).long())
        return torch.where(ids >= 0, s, 0.0)[..., 1:].sort(dim=-1).values  # skip the local block
    gap = (chosen(got) - chosen(want)).abs().max() / scores[torch.isfinite(scores)].abs().max()
    bad_local = float((got[..., 0] != want[..., 0]).any())
    return Check(f"msa-index {fmt} q_len<={bt.max_q}", float(gap) + bad_local, 1e-3)


@dataclass(frozen=True)
class MoeSetup:
    """One MoE layout of a GPU: its expert weights and how tokens route to them."""

    name: str
    weights: dict
    n_choice: int  # experts the router picks top-k among
    n_local: int  # ids >= n_local live on other ranks (-1 here)


def make_weights(n_exp: int, inter: int, sh: Shapes, dev, gen) -> dict:
    def rnd(*s, scale):
        return (torch.randn(*s, device=dev, generator=gen) * scale).to(torch.bfloat16)
    return {"w_gate": rnd(n_exp, inter, sh.hidden, scale=sh.hidden ** -0.5),
            "w_up": rnd(n_exp, inter, sh.hidden, scale=sh.hidden ** -0.5),
            "w_down": rnd(n_exp, sh.hidden, inter, scale=inter ** -0.5)}


def make_moe_setups(sh: Shapes, dev, gen) -> list[MoeSetup]:
    """EP8 (16 whole experts, top-4 over 128: only local ids count), the same weights with every
    pick local, and TP8 (128 experts of I/8, top-4 over 128, all local)."""
    ep = make_weights(sh.n_local, sh.inter, sh, dev, gen)
    tp = make_weights(sh.n_routed, sh.tp_inter, sh, dev, gen)
    return [MoeSetup("moe-ep", ep, sh.n_routed, sh.n_local),
            MoeSetup("moe-local", ep, sh.n_local, sh.n_local),
            MoeSetup("moe-tp", tp, sh.n_routed, sh.n_routed)]


def make_routing(n_tok: int, setup: MoeSetup, sh: Shapes, dev, gen) -> dict:
    """Sigmoid top-k weights renormalized and scaled by 2; other ranks' experts become -1."""
    logits = torch.randn(n_tok, setup.n_choice, device=dev, generator=gen)
    w, ids = torch.topk(torch.sigmoid(logits), sh.top_k, dim=-1)
    ids = torch.where(ids < setup.n_local, ids, -1).to(torch.int32)
    x = torch.randn(n_tok, sh.hidden, device=dev, generator=gen).to(torch.bfloat16)
    return {"x": x, "topk_ids": ids, "topk_weights": (w / w.sum(-1, keepdim=True) * 2.0).float()}


def check_moe(setup: MoeSetup, sh: Shapes, dev, gen) -> Check:
    routing = make_routing(16, setup, sh, dev, gen)
    got = fused_moe(**routing, **setup.weights, activation=MoeActivation.SWIGLUOAI, backend=TRITON)
    x32 = {k: v.float() if v.is_floating_point() else v for k, v in routing.items()}
    want = fused_moe_ref(**x32, **setup.weights, activation=MoeActivation.SWIGLUOAI)
    return Check(f"{setup.name} swigluoai T=16", rel_err(got, want), 3e-2)


# ---------------------------------------------------------------- bytes each kernel must move

def attn_bytes(fmt: str, n_req: int, n_tok: int, ctx: int, sh: Shapes, sparse: bool) -> int:
    """K and V of the whole context per request (dense) or of its selected blocks per token."""
    keys = n_tok * min(ctx, sh.topk * sh.page) if sparse else n_req * ctx
    act = 2 * n_tok * sh.hq * sh.d * 2  # q in, out
    return int(keys * sh.hkv * 2 * kv_bytes_per_token(fmt, sh.d) + act)


def index_bytes(fmt: str, n_req: int, n_tok: int, ctx: int, sh: Shapes) -> int:
    """Every index key of the context, the block scores written and read back, iq."""
    keys = n_req * ctx * kv_bytes_per_token("fp8" if fmt == "fp8" else "bf16", sh.di)
    scores = 2 * n_tok * sh.hkv * math.ceil(ctx / sh.page) * 4
    return int(keys + scores + n_tok * sh.hkv * sh.di * 2)


def moe_bytes(routing: dict, weights: dict) -> int:
    """Gate, up and down of every distinct local expert routed to, plus x in and out."""
    ids = routing["topk_ids"]
    _, inter, hidden = weights["w_gate"].shape
    experts = int(torch.unique(ids[ids >= 0]).numel())
    return experts * 3 * inter * hidden * 2 + 2 * ids.shape[0] * hidden * 2


# ---------------------------------------------------------------- timing

COLD_BYTES = 160e6  # one graph replay streams > 3x the 50 MB L2: every call reads cold data
MAX_COPIES = 256
REPLAYS = 7


def n_copies(bytes_per_call: int) -> int:
    """Calls on distinct inputs per timed graph (1 on CPU)."""
    if not torch.cuda.is_available():
        return 1
    return int(min(MAX_COPIES, max(4, math.ceil(COLD_BYTES / max(1, bytes_per_call)))))


def n_routings() -> int:
    """MoE calls per timed graph, each on its own routing (the weights alone exceed the L2)."""
    return 8 if torch.cuda.is_available() else 1


def time_us(calls: list) -> float:
    """Median device time per call (us): all calls captured in one CUDA graph, replayed."""
    if not torch.cuda.is_available():
        calls[0]()
        t0 = time.perf_counter()
        calls[0]()
        return (time.perf_counter() - t0) * 1e6
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run = _capture(calls)
    run()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def _capture(calls):
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        return graph.replay
    except Exception as exc:  # noqa: BLE001 - not capturable: time plain launches
        print(f"  (CUDA graph capture failed: {type(exc).__name__}: {exc}; timing launches)",
              file=sys.stderr)
        torch.cuda.synchronize()
        return lambda: [call() for call in calls]


def attn_call(pool, sh, seq, q_lens, dev, gen, sparse=False, tile=None):
    bt = make_batch(pool, seq, q_lens, sh, dev, gen)
    o = torch.empty_like(bt.q)
    sel = run_select(pool, bt, sh) if sparse else None
    return lambda: run_attention(pool, bt, sh, sel=sel, out=o, tile=tile)


def select_call(pool, sh, seq, q_lens, dev, gen):
    bt = make_batch(pool, seq, q_lens, sh, dev, gen)
    sel = run_select(pool, bt, sh)
    return lambda: run_select(pool, bt, sh, out=sel)


def moe_call(setup: MoeSetup, sh, batch, dev, gen, tiles=None):
    routing = make_routing(batch, setup, sh, dev, gen)
    o = torch.empty_like(routing["x"])
    def call():
        return fused_moe(**routing, **setup.weights, out=o, backend=TRITON, tiles=tiles)
    return call, moe_bytes(routing, setup.weights)


def attention_timing(pool, fmt, sh, dev, gen, batch, ctx, q_len, tile=None, kernel="attn") -> Timing:
    nbytes = attn_bytes(fmt, batch, batch * q_len, ctx, sh, False)
    calls = [attn_call(pool, sh, [ctx] * batch, [q_len] * batch, dev, gen, tile=tile)
             for _ in range(n_copies(nbytes))]
    label = fmt if tile is None else f"{fmt}/t{tile}"
    return Timing(kernel, label, batch, ctx, q_len, time_us(calls), nbytes)


def write_timing(pool, fmt, sh, dev, gen, batch) -> Timing:
    """Decode-step write of one layer's K for `batch` tokens into random slots."""
    nbytes = int(batch * sh.hkv * (sh.d * 2 + kv_bytes_per_token(fmt, sh.d)))
    calls = []
    for _ in range(n_copies(nbytes)):
        x = torch.randn(batch, sh.hkv, sh.d, device=dev, generator=gen).to(torch.bfloat16)
        slots = torch.randperm(pool.n_pages * sh.page, device=dev, generator=gen)[:batch]
        calls.append(partial(write_pages, pool.k, x, slots, TRITON))
    return Timing("kv-write", fmt, batch, 0, 1, time_us(calls), nbytes)


def index_timing(pool, fmt, sh, dev, gen, batch, ctx) -> Timing:
    nbytes = index_bytes(fmt, batch, batch, ctx, sh)
    calls = [select_call(pool, sh, [ctx] * batch, [1] * batch, dev, gen) for _ in range(n_copies(nbytes))]
    return Timing("msa-index", fmt, batch, ctx, 1, time_us(calls), nbytes)


def sparse_timing(pool, fmt, sh, dev, gen, batch, ctx) -> Timing:
    nbytes = attn_bytes(fmt, batch, batch, ctx, sh, True)
    calls = [attn_call(pool, sh, [ctx] * batch, [1] * batch, dev, gen, sparse=True)
             for _ in range(n_copies(nbytes))]
    return Timing("msa-attn", fmt, batch, ctx, 1, time_us(calls), nbytes)


def moe_timing(setup: MoeSetup, sh, dev, gen, batch, tiles=None) -> Timing:
    made = [moe_call(setup, sh, batch, dev, gen, tiles) for _ in range(n_routings())]
    nbytes = sum(b for _, b in made) // len(made)  # mean over the routings drawn
    label = "bf16" if tiles is None else (
        f"{tiles.block_m}/{tiles.block_n}/{tiles.block_k}/w{tiles.num_warps}s{tiles.num_stages}")
    return Timing(setup.name, label, batch, 0, 1, time_us([c for c, _ in made]), nbytes)


MOE_TILES = (MoeTiles(16, 64, 128, 4, 4), MoeTiles(16, 128, 128, 4, 3), MoeTiles(32, 64, 128, 4, 4),
             MoeTiles(64, 128, 64, 8, 3))


def timing_jobs(pools, moes, sh, dev, gen, tuning: bool):
    """(label, thunk -> Timing) for every timed configuration, most important first (the time
    budget cuts from the end): decode rows of every kernel, then verify chunks, then tuning."""
    for fmt, pool in pools.items():
        for ctx in sh.contexts:
            for batch in sh.batches:
                yield f"attn {fmt} B{batch} ctx{ctx} q1", partial(
                    attention_timing, pool, fmt, sh, dev, gen, batch, ctx, 1)
                yield f"msa-index {fmt} B{batch} ctx{ctx}", partial(index_timing, pool, fmt, sh, dev, gen, batch, ctx)
                yield f"msa-attn {fmt} B{batch} ctx{ctx}", partial(sparse_timing, pool, fmt, sh, dev, gen, batch, ctx)
    for setup in moes:
        for batch in sh.batches:
            yield f"{setup.name} B{batch}", partial(moe_timing, setup, sh, dev, gen, batch)
    for fmt, pool in pools.items():
        for batch in sh.batches:
            yield f"kv-write {fmt} B{batch}", partial(write_timing, pool, fmt, sh, dev, gen, batch)
    for fmt, pool in pools.items():
        for ctx in sh.contexts:
            for batch in sh.batches:
                yield f"attn {fmt} B{batch} ctx{ctx} q{sh.chunk}", partial(
                    attention_timing, pool, fmt, sh, dev, gen, batch, ctx, sh.chunk)
    if tuning:
        yield from tuning_jobs(pools, moes, sh, dev, gen)


def tuning_jobs(pools, moes, sh, dev, gen):
    """Alternatives to the default launch configs: attention tiles, MoE tile sizes."""
    pool, ctx = pools.get("bf16"), sh.contexts[len(sh.contexts) // 2]
    for batch in (sh.batches[0], sh.batches[-1]) if pool is not None else ():
        for tile in (t for t in (32, 64, 128) if t <= sh.page):
            yield f"attn tile {tile} B{batch}", partial(
                attention_timing, pool, "bf16", sh, dev, gen, batch, ctx, 1, tile, "attn-tile")
    for setup in moes[1:]:  # all-local EP and TP
        for batch in sh.batches:
            for t in MOE_TILES:
                yield f"{setup.name} tiles {t} B{batch}", partial(moe_timing, setup, sh, dev, gen, batch, t)


def run_timings(jobs, deadline: float) -> tuple[list[Timing], list[str]]:
    """Run each job until the deadline; a failing job is reported and skipped."""
    rows, problems = [], []
    for label, job in jobs:
        if time.perf_counter() > deadline:
            problems.append(f"{label}: skipped (time budget)")
            continue
        try:
            rows.append(job())
            print(f"  {label}: {rows[-1].us:.1f} us", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - one broken config must not hide the others
            problems.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"  {label}: FAILED {problems[-1]}", file=sys.stderr, flush=True)
    return rows, problems


# ---------------------------------------------------------------- main

def guarded(name: str, fn) -> Check:
    """fn() -> Check; an exception becomes a failed check (the run goes on)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - report it as a failed check, go on
        print(f"  check {name} raised {type(exc).__name__}: {str(exc)[:2000]}", file=sys.stderr, flush=True)
        return Check(f"{name} (raised {type(exc).__name__})", float("inf"), 0.0)


def run_checks(pools: dict, moes: list, sh: Shapes, dev, gen) -> list[Check]:
    big, small = max(sh.contexts[:2]), min(sh.contexts)
    seq = [big, small + 5, big // 2 + 7, sh.page + 1]  # partial last pages, one near-empty
    checks = []
    for fmt, pool in pools.items():
        for q_lens in ([1, 1, 1, 1], [sh.chunk, 1, 4 * sh.chunk, 2]):  # decode; verify chunks
            bt = make_batch(pool, seq, q_lens, sh, dev, gen)
            name = f"{fmt} q_len<={bt.max_q}"
            checks.append(guarded(f"attn {name}", partial(check_attention, pool, bt, sh, fmt)))
            checks.append(guarded(f"msa-index {name}", partial(check_select, pool, bt, sh, fmt)))
            checks.append(guarded(f"msa-attn {name}", partial(check_sparse, pool, bt, sh, fmt)))
        checks.append(guarded(f"kv-write {fmt}", partial(check_write, pool, sh, fmt, dev, gen)))
    for setup in moes[1:]:
        checks.append(guarded(setup.name, partial(check_moe, setup, sh, dev, gen)))
    return checks


def print_checks(checks: list[Check]) -> None:
    print(f"{'check':34} {'rel_err':>10} {'tol':>8}  ok")
    for c in checks:
        print(f"{c.name:34} {c.err:10.2e} {c.tol:8.0e}  {'yes' if c.ok else 'NO'}")


def print_table(rows: list[Timing]) -> None:
    rows = sorted(rows, key=lambda r: (r.kernel, r.fmt, r.q_len, r.ctx, r.batch))
    print(f"\n{'kernel':10} {'fmt/config':18} {'B':>3} {'ctx':>6} {'q':>2} {'us':>9} {'MB':>9} "
          f"{'TB/s':>6} {'%peak':>5}")
    for r in rows:
        print(f"{r.kernel:10} {r.fmt:18} {r.batch:3d} {r.ctx:6d} {r.q_len:2d} {r.us:9.1f} "
              f"{r.bytes_moved / 1e6:9.2f} {r.tb_per_s:6.2f} {r.pct_peak:5.1f}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    p.add_argument("--json", type=Path, help="also write checks and timings to this JSON file")
    p.add_argument("--formats", default="bf16,fp8,nvfp4", help="KV formats to run")
    p.add_argument("--skip-timing", action="store_true", help="correctness checks only")
    p.add_argument("--skip-tuning", action="store_true", help="no alternative tile configs")
    p.add_argument("--budget-s", type=float, default=250.0,
                   help="stop starting new timings after this many seconds (the run stays < 5 min)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("no CUDA device: run with --tiny (and TRITON_INTERPRET=1) for a CPU smoke run", file=sys.stderr)
        return 2
    sh = TINY if args.tiny else Shapes()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    print(use_device_bandwidth(dev), flush=True)
    n_pages = max(sh.batches) * math.ceil(max(sh.contexts) / sh.page) + 8
    t0 = time.perf_counter()
    pools = {fmt: make_pool(fmt, n_pages, sh, dev, gen) for fmt in args.formats.split(",")}
    moes = make_moe_setups(sh, dev, gen)
    checks = run_checks(pools, moes, sh, dev, gen)
    print_checks(checks)
    rows, problems = [], []
    if not args.skip_timing:
        jobs = timing_jobs(pools, moes, sh, dev, gen, tuning=not args.skip_tuning)
        rows, problems = run_timings(jobs, t0 + args.budget_s)
    failed = [c.name for c in checks if not c.ok]
    for line in problems:
        print(f"timing problem: {line}")
    print(f"\nchecks: {len(checks) - len(failed)}/{len(checks)} passed"
          f"{' FAILED: ' + ', '.join(failed) if failed else ''}; {len(rows)} timings, "
          f"{len(problems)} skipped/failed; {time.perf_counter() - t0:.0f} s; "
          f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (interpreter)'}")
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"checks": [asdict(c) | {"ok": c.ok} for c in checks],
                                         "timings": [asdict(r) for r in rows],
                                         "problems": problems}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    if "--tiny" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
