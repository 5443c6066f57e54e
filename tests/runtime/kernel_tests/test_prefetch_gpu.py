"""The weight GEMMs' L2 prefetch before the PDL wait (kernels/prefetch.py) on the GPU at one TP8 rank's shapes:
every prefetch mode gives the same bits as none (the prefetch returns nothing; only when bytes arrive changes),
for the skinny dot (plain, gated), the fp32 router GEMV, and the MXFP8 GEMV / first kernel / dot, row- and
block-major; and in a CUDA graph of a dependent chain, where the prefetch runs while the kernel before finishes.
The rank's whole decode step with it: tests/benchmarks/test_decode_pdl_gpu.py."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import PDL, Pdl
from m3bench.runtime.kernels.mx_linear import MxKernel, mx_tiles
from m3bench.runtime.kernels.mxfp8 import linear_tiles, mxfp8_linear
from m3bench.runtime.kernels.prefetch import PREFETCH, WeightPrefetch, prefetch_inputs
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.kernels.skinny import Gate, skinny_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GATE = Gate(MoeActivation.SWIGLUOAI, 1.702, 7.0)


@pytest.fixture(autouse=True)
def pdl_on():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("PDL (and the bulk prefetch) need sm90+")
    before = PDL["launch"], PREFETCH["mode"]
    PDL["launch"] = Pdl.ON
    yield
    PDL["launch"], PREFETCH["mode"] = before


def _modes(call) -> dict:
    out = {}
    for mode in WeightPrefetch:
        PREFETCH["mode"] = mode
        out[mode] = call()
        torch.cuda.synchronize()
    return out


def _plain_cases(g):
    dev = "cuda"
    for n, k in ((1920, 6144), (6144, 1024), (6144, 384)):
        w = (torch.randn(n, k, device=dev, generator=g) * k ** -0.5).to(torch.bfloat16)
        for rows in (1, 4, 16):
            x = torch.randn(rows, k, device=dev, generator=g).to(torch.bfloat16)
            yield f"plain {n}x{k} {rows} rows", (lambda x=x, w=w: skinny_linear(x, w)), (x.float() @ w.float().T)
    w = (torch.randn(2 * 384, 6144, device=dev, generator=g) * 6144 ** -0.5).to(torch.bfloat16)
    x = torch.randn(4, 6144, device=dev, generator=g).to(torch.bfloat16)
    yield "gated 768x6144", (lambda: skinny_linear(x, w, gate=GATE)), None
    r = torch.randn(128, 6144, device=dev, generator=g) * 6144 ** -0.5
    for rows in (1, 4):
        x = torch.randn(rows, 6144, device=dev, generator=g)
        yield f"router {rows} rows", (lambda x=x: skinny_linear(x, r)), x @ r.T


def _mx_cases(g):
    dev = "cuda"
    for n, k in ((1920, 6144), (6144, 1024)):
        w = (torch.randn(n, k, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
        s = torch.randint(118, 124, (n, k // 32), device=dev, generator=g, dtype=torch.uint8)
        want_w = quant.dequant_mxfp8(w, s, torch.float32)
        for layout, wl in (("row-major", w), ("block-major", quant.block_major(w))):
            for rows in (1, 4, 16, 64):
                x = torch.randn(rows, k, device=dev, generator=g).to(torch.bfloat16)
                want = x.float() @ want_w.T
                yield f"mxfp8 {layout} {n}x{k} {rows} rows", (lambda x=x, wl=wl: mxfp8_linear(x, wl, s)), want
            x = torch.randn(4, k, device=dev, generator=g).to(torch.bfloat16)
            yield (f"mxfp8 {layout} {n}x{k} first kernel split", (lambda x=x, wl=wl: mxfp8_linear(
                x, wl, s, tiles=linear_tiles(4, n, k))), x.float() @ want_w.T)
            x = torch.randn(1, k, device=dev, generator=g).to(torch.bfloat16)
            yield (f"mxfp8 {layout} {n}x{k} GEMV", (lambda x=x, wl=wl: mxfp8_linear(
                x, wl, s, tiles=mx_tiles(1, n, k, MxKernel.GEMV))), x.float() @ want_w.T)


@torch.inference_mode()
@pytest.mark.parametrize("cases", [_plain_cases, _mx_cases])
def test_every_prefetch_mode_gives_the_same_bits(cases):
    g = torch.Generator(device="cuda").manual_seed(5)
    bad = []
    for name, call, want in cases(g):
        got = _modes(call)
        for mode, y in got.items():
            if not torch.equal(y, got[WeightPrefetch.OFF]):
                bad.append(f"{name}: {mode.value} differs from off")
        if want is not None:
            rel = float((got[WeightPrefetch.OFF].float() - want).abs().max() / want.abs().max())
            if rel > 2e-2:
                bad.append(f"{name}: {rel:.2e} from fp32")
    assert not bad, "\n".join(bad)


@torch.inference_mode()
def test_prefetch_asked_for_at_the_rank_shapes():
    """Under PDL the rank's weights are aligned for the bulk prefetch: HEAD and WHOLE ask for bytes."""
    w = torch.empty(1920, 6144, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(1, 6144, device="cuda", dtype=torch.bfloat16)
    PREFETCH["mode"] = WeightPrefetch.WHOLE
    assert prefetch_inputs(x, w, 1536, 128) == 1536
    PREFETCH["mode"] = WeightPrefetch.HEAD
    assert prefetch_inputs(x, w, 1536, 128) == 256


@torch.inference_mode()
def test_a_prefetching_chain_replays_in_a_graph_as_it_runs_eagerly():
    """A dependent chain (norm-like op, then GEMMs) captured with PDL and WHOLE prefetch: each replay's output
    equals the eager chain's with prefetch off."""
    g = torch.Generator(device="cuda").manual_seed(9)
    ws = [(torch.randn(1920, 6144, device="cuda", generator=g) * 6144 ** -0.5).to(torch.bfloat16) for _ in range(2)]
    up = (torch.randn(6144, 1920, device="cuda", generator=g) * 1920 ** -0.5).to(torch.bfloat16)
    x = torch.randn(1, 6144, device="cuda", generator=g).to(torch.bfloat16)

    def chain():
        h = skinny_linear(x * 1.5, ws[0])
        h = skinny_linear(skinny_linear(h, up), ws[1])
        return skinny_linear(h, up)

    PREFETCH["mode"] = WeightPrefetch.OFF
    want = chain()
    PREFETCH["mode"] = WeightPrefetch.WHOLE
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
