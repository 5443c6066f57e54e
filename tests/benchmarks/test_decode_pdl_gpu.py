"""On the GPU: the decode fast path replayed in a CUDA graph gives bit-identical logits with programmatic
dependent launch off, on (trigger after the wait) and early (trigger before it), at one TP8 rank's shapes, and
every replay repeats the first (a race between overlapping kernels shows as a replay that differs, or NaN: the
output is poisoned before each replay). The same with the shared expert's gate|up on a side stream beside the
router (SparseMoe.shared_beside GATE_UP, batches of at most 4): the same kernels on the same inputs, run
concurrently. The whole shared expert beside (WHOLE) adds it in the routed sum, another rounding; so do the FEW_ROWS
sets at batch 1 and 4 (WHOLE + the q|k|v GEMM ending in its heads' norm / RoPE / cache writes, kernels.skinny_heads;
+ the MSA index branch on the side lane, Attention.index_beside; both), whose GEMMs split otherwise. Each of these
replays, bit for bit, what the same set gives with its side lanes inline (kernels.lanes.inline_lanes: no race), and
its logits are within bf16 noise of PDL off's, or, where the other rounding flipped a near-tie of a top-k (an MSA
selection, the router's), within it once the step's discrete choices are pinned to PDL off's.

Every kernel of the step is deterministic (split K and split KV meet in a fixed order) and PDL adds only the wait
and the trigger to each kernel, so the three modes agree to the bit. Cases: bf16 weights with FP8 and hybrid
(NVFP4 MSA) KV, MXFP8 weights, NVFP4 experts; batches 1, 4, 16, 64 (the skinny GEMV and dot, the MXFP8 GEMV /
first kernel / dot, the fused MoE's split-K, shared-expert and grouped paths), realistic and all-local routing;
8k context (split-KV attention, the MSA indexer over 64 blocks)."""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import pytest
import torch
from benchmark_scripts import load_benchmark

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CTX = 8192
BATCHES = (1, 4, 16, 64)
REPLAYS = 3
# decode_setup.OpsSet: PDL off, on, early trigger; on with the shared expert's gate|up on the side stream
OPS = ("skinny", "skinny-pdl", "skinny-pdl-early", "skinny-pdl-side")
WHOLE = "skinny-pdl-side-whole"  # the whole shared expert beside: its own rounding, so its replays repeat its first
# at up to 4 rows, each its own rounding: the q|k|v GEMM ending in its heads' norm / RoPE / writes (other tiles), the
# MSA index branch on the side lane (its GEMM apart from q|k|v: other splits), both
FEW_ROWS = ("skinny-pdl-side-whole-heads", "skinny-pdl-side-whole-index", "skinny-pdl-side-whole-heads-index",
            "skinny-pdl-side-whole-split",  # ... and the routed experts splitting K at one token (other sums)
            "skinny-pdl-side-whole-split-down2",  # ... their down GEMM's K too (the runtime's)
            "skinny-pdl-side-whole-split-down2-sumnorm",  # ... their sum in the next add + norm's launch
            "skinny-pdl-side-whole-split-down2-gemv",  # down2, one token's routed experts as GEMVs (other sums)
            "skinny-pdl-side-whole-split-down2-every")  # down2 + heads, index beside, sum in the norm, GEMVs
DOWN2, SUM_NORM = FEW_ROWS[4:6]


@pytest.fixture(scope="module")
def bench():
    setup = load_benchmark("decode_setup")  # puts benchmarks/ on sys.path for the two below
    import decode_floor
    import decode_routing

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("PDL needs sm90+")
    return setup, decode_floor, decode_routing


def _rank(setup, floor, weights: str, kv_dtype: str):
    """(model, kv, shapes) over the dense layers + 2 MSA + MoE layers, random KV for 64 x 8k. Plain weights: one
    TP8/EP8 rank (decode_step.py's); quantized: the world-1 per-GPU shapes (mxfp8_gpu.py's: the rank model's
    replicated index projection is plain-only)."""
    from m3bench.runtime.attention.select import make_backend
    from m3bench.runtime.kv_cache import KVCache, KVDtype
    from m3bench.runtime.layers.weight_format import LinearFormat
    from m3bench.runtime.model import M3ForCausalLM

    fmt, dev = LinearFormat(weights), torch.device("cuda")
    s = floor.RANK if fmt is LinearFormat.PLAIN else floor.M3Shapes()
    cfg = setup.our_config(setup.hf_m3_config(s, s.dense_layers + 2, CTX * 2 + s.page))
    backend = make_backend("auto", dev, cfg, s.page)
    if fmt is LinearFormat.PLAIN:
        model = setup.rank_model(s, cfg, torch.bfloat16, dev, backend)
    else:
        model = M3ForCausalLM(cfg, torch.bfloat16, dev, backend=backend, weights=fmt)
        model.init_dummy(0)
    kv = KVCache(cfg, max(BATCHES) * floor.pages_per_seq(s, CTX) + 1, s.page, KVDtype(kv_dtype), torch.bfloat16,
                 dev, model.tp)
    _fill(setup, kv)
    return model, kv, s


def _fill(setup, kv) -> None:
    """Random pages; NVFP4 ones as random codes with scales in [0.25, 2) (fill_random_ leaves their scales 0)."""
    setup.fill_random_(kv)
    g = torch.Generator(device="cuda").manual_seed(1)
    for store in [*kv.k, *kv.v, *(s for s in kv.ik if s is not None)]:
        if store.scales is not None:
            store.data.copy_(torch.randint(0, 256, store.data.shape, generator=g, device="cuda", dtype=torch.uint8))
            scales = torch.rand(store.scales.shape, generator=g, device="cuda") * 1.75 + 0.25
            store.scales.copy_(scales.to(store.scales.dtype))


def _step_inputs(setup, s, batch: int):
    """(decode metadata at CTX, input ids) of a batch's step: the same for every run of that batch."""
    dev = torch.device("cuda")
    ids = torch.randint(0, s.vocab, (batch,), generator=torch.Generator().manual_seed(batch)).to(dev)
    return setup.decode_meta(s, batch, CTX, dev), ids


@torch.inference_mode()
def _replays(setup, model, kv, s, batch: int, ops: str, inline: bool = False) -> list[torch.Tensor]:
    """The step's logits from REPLAYS replays of its CUDA graph, captured under ops' PDL mode (inline: the side
    lanes' work captured in order on the main stream, kernels.lanes.inline_lanes)."""
    from m3bench.runtime.kernels.backend import pdl_launch
    from m3bench.runtime.kernels.lanes import inline_lanes

    dev = torch.device("cuda")
    meta, ids = _step_inputs(setup, s, batch)
    out = torch.empty(batch, s.vocab, dtype=torch.float32, device=dev)

    def step():
        out.copy_(model.compute_logits(model(ids, meta.positions, meta, kv)))

    with setup.pdl_mode(), inline_lanes() if inline else contextlib.nullcontext():
        setup.set_ops(model, setup.OpsSet(ops))
        assert pdl_launch(out) == (ops != "skinny")  # the PDL sets really launch with PDL here
        run, graphed = setup.graphed(step, dev)
        assert graphed, "the decode step did not capture"
        got = []
        for _ in range(REPLAYS):
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            got.append(out.clone())
    return got


def _mismatches(runs: dict[str, list[torch.Tensor]], case: str, want: torch.Tensor | None = None) -> list[str]:
    """Every replay of every mode against `want` (default PDL off's first replay), bit for bit."""
    want = runs["skinny"][0] if want is None else want
    if not torch.isfinite(want).all():
        return [f"{case}: non-finite logits"]
    bad = []
    for ops, replays in runs.items():
        for i, got in enumerate(replays):
            if not torch.equal(got, want):
                diff = (got - want).abs().nan_to_num(float("inf")).max().item()
                bad.append(f"{case} {ops} replay {i}: max |diff| {diff:.3e}")
    return bad


def _close(got: torch.Tensor, want: torch.Tensor, case: str, ops: str = WHOLE) -> list[str]:
    """Logits of another rounding order (the shared expert added in fp32 to the routed sum, not in its down GEMM's
    epilogue; the q|k|v GEMM in one-head tiles): within bf16 noise of the step's logits' scale."""
    rel = float((got - want).abs().max() / want.abs().max())
    return [] if rel < 3e-2 else [f"{case} {ops}: relative max |diff| {rel:.3e} against PDL off"]


def _beside(setup, model, kv, s, batch: int, ops: str, want: torch.Tensor, case: str) -> list[str]:
    """A set with work on the side lane: every replay equals the same set captured with its side lanes inline
    (the same kernels in order: running beside changes no bit), and its logits are within rounding of PDL off's
    (`want`): directly, or, where another rounding flipped a near-tie of a top-k (the MSA blocks' or the router's:
    after a flip the logits of a random model differ by far more), with the step's choices pinned to PDL off's."""
    got = _replays(setup, model, kv, s, batch, ops)
    bad = _mismatches({ops: got}, case, _replays(setup, model, kv, s, batch, ops, inline=True)[0])
    far = _close(got[0], want, case, ops)
    return bad + (far and _pinned_close(setup, model, kv, s, batch, ops, case))


@torch.inference_mode()
def _pinned_close(setup, model, kv, s, batch: int, ops: str, case: str) -> list[str]:
    """ops' eager logits against PDL off's with the step's discrete choices (Choices) replayed from PDL off's."""
    want, want_made = _eager(setup, model, kv, s, batch, "skinny")
    _, own_made = _eager(setup, model, kv, s, batch, ops)
    got, replayed = _eager(setup, model, kv, s, batch, ops, replay=want_made)
    assert len(replayed) == len(want_made) == len(own_made), "both steps make the same choices in the same order"
    flipped = sum(not _same(a, b) for a, b in zip(want_made, own_made))
    return _close(got, want, f"{case} (choices pinned; unpinned {flipped} of {len(want_made)} differ)", ops)


class Choices:
    """A step's discrete choices, each MSA layer's selected blocks and each MoE layer's router top-k (its weights,
    ids and alignment), recorded in order as the step makes them, or replayed from another step's record."""

    def __init__(self, model, replay: list | None = None):
        self.model, self.replay, self.made = model, replay, []

    def take(self, make):
        self.made.append(self.replay[len(self.made)] if self.replay is not None else _clone(make()))
        return self.made[-1]

    @contextlib.contextmanager
    def active(self):
        from m3bench.runtime.layers import moe

        select, align = self.model.backend.msa_select, moe.router_topk_align
        with (mock.patch.object(self.model.backend, "msa_select", lambda *a, **k: self.take(lambda: select(*a, **k))),
              mock.patch.object(moe, "router_topk_align", lambda *a, **k: self.take(lambda: align(*a, **k)))):
            yield self


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, tuple):
        return tuple(_clone(x) for x in v)
    return type(v)(*(_clone(getattr(v, f.name)) for f in dataclasses.fields(v)))  # MoeAlignment


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))


@torch.inference_mode()
def _eager(setup, model, kv, s, batch: int, ops: str, replay: list | None = None):
    """(the step's logits run eagerly under ops, the same inputs as _replays; its Choices made, or replayed)."""
    meta, ids = _step_inputs(setup, s, batch)
    with setup.pdl_mode(), Choices(model, replay).active() as choices:
        setup.set_ops(model, setup.OpsSet(ops))
        out = model.compute_logits(model(ids, meta.positions, meta, kv)).float()
        torch.cuda.synchronize()
    assert choices.made, "the step made no MSA selection or router top-k"
    return out, choices.made


@pytest.mark.parametrize("weights, kv_dtype", [("plain", "fp8"), ("plain", "hybrid"), ("mxfp8", "fp8"),
                                               ("nvfp4-experts", "hybrid")])
def test_pdl_modes_give_identical_decode_steps(bench, weights, kv_dtype):
    from m3bench.runtime.kernels.lanes import MAIN, SIDE
    from m3bench.runtime.kernels.mx_linear import split_counters

    setup, floor, routing = bench
    model, kv, s = _rank(setup, floor, weights, kv_dtype)
    bad = []
    for route in routing.Routing:
        routing.set_routing(model, route)
        for batch in BATCHES:
            case = f"{weights} weights, {kv_dtype} KV, {route.value}, B={batch}"
            runs = {ops: _replays(setup, model, kv, s, batch, ops) for ops in OPS}
            bad += _mismatches(runs, case)
            for ops in (WHOLE, *(FEW_ROWS if batch <= 4 else ())):
                bad += _beside(setup, model, kv, s, batch, ops, runs["skinny"][0], case)
            if batch <= 4:  # the MoE's sum in the next add + norm's launch: the same sums, so down2's bits
                bad += _mismatches({SUM_NORM: _replays(setup, model, kv, s, batch, SUM_NORM)}, case,
                                   _replays(setup, model, kv, s, batch, DOWN2)[0])
    for lane in (MAIN, SIDE):
        assert not split_counters(torch.device("cuda"), lane).any(), f"lane {lane}'s split-K counters left non-zero"
    assert not bad, "\n".join(bad)
