"""On the GPU: work on the side lane (kernels/lanes.py) runs beside the main stream and gives what it gives on
the main stream alone. The MoE block with its shared expert's gate|up beside the router (SparseMoe.shared_beside
GATE_UP) is bit-identical to the block without it (OFF), eagerly and replayed in a CUDA graph; with the whole
shared expert beside (WHOLE, added in the routed sum: another rounding) it is within bf16 noise of OFF and its
replays repeat its eager result; split-K GEMMs launched on both lanes at once keep their own counters (each
result repeats, both lanes' counters end zero)."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.config import Activation, MoeConfig
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.lanes import MAIN, SIDE, SideLane
from m3bench.runtime.kernels.mx_linear import split_counters
from m3bench.runtime.kernels.skinny import skinny_linear
from m3bench.runtime.layers.moe import SharedBeside, SparseMoe

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
HIDDEN = 2048
MOE = MoeConfig(num_experts=16, top_k=4, intermediate_size=256, shared_intermediate_size=384,
                routed_scaling_factor=2.5, use_routing_bias=True)


def _moe() -> SparseMoe:
    moe = SparseMoe(HIDDEN, MOE, Activation.SWIGLUOAI, 1.702, 7.0, torch.bfloat16, torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    for p in moe.parameters():
        p.data.copy_((torch.randn(p.shape, generator=g, device="cuda") * p.shape[-1] ** -0.5).to(p.dtype))
    return moe


def _graphed(fn):
    """fn captured in a CUDA graph (after two eager warm-ups on a side stream, as the engine does)."""
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(warm)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@torch.inference_mode()
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_shared_expert_beside_the_router(tokens):
    moe = _moe()
    x = torch.randn(tokens, HIDDEN, device="cuda").to(torch.bfloat16)
    assert moe.align_fusable(x) and not moe.shared_fusable(x)  # the path that takes the side lane
    out = {}
    for mode in SharedBeside:
        moe.shared_beside = mode
        out[mode] = moe(x)
    torch.cuda.synchronize()
    assert torch.equal(out[SharedBeside.GATE_UP], out[SharedBeside.OFF])
    assert _rel(out[SharedBeside.WHOLE], out[SharedBeside.OFF]) < 1e-2
    moe.kernel_backend = KernelBackend.TORCH
    want = moe(x)
    assert all(_rel(o, want) < 2e-2 for o in out.values())

    moe.kernel_backend = KernelBackend.AUTO
    y = torch.empty_like(x)

    def step():
        y.copy_(moe(x))

    for mode in (SharedBeside.GATE_UP, SharedBeside.WHOLE):
        moe.shared_beside = mode
        graph = _graphed(step)
        for _ in range(3):
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, out[mode]), mode
    for lane in (MAIN, SIDE):
        assert not split_counters(x.device, lane).any()


@torch.inference_mode()
def test_split_k_gemms_on_both_lanes_at_once_keep_their_counters():
    g = torch.Generator(device="cuda").manual_seed(1)
    w = [(torch.randn(n, 6144, generator=g, device="cuda") * 0.01).to(torch.bfloat16) for n in (1920, 768)]
    x = torch.randn(1, 6144, generator=g, device="cuda").to(torch.bfloat16)
    want = [skinny_linear(x, wi) for wi in w]
    got = [torch.empty_like(t) for t in want]

    def step():
        side = SideLane(x)
        with side:
            b = skinny_linear(x, w[1])
        got[0].copy_(skinny_linear(x, w[0]))
        side.join(b)
        got[1].copy_(b)

    graph = _graphed(step)
    for _ in range(20):
        for t in got:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    for lane in (MAIN, SIDE):
        assert not split_counters(x.device, lane).any()
