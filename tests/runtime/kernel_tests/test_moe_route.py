"""The fused MoE's gate|up launch routing one token itself (kernels.router.KernelRoute, moe_route_triton) against the
router's own launch (router_topk_align) feeding the same fused MoE: the same weights, local ids, alignment and output
bits, at 0-4 local picks, with and without the correction bias, plain and MXFP8 experts, the down GEMM whole or split;
and against the fp64 reference. Interpreter."""

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeTiles, first_generation_tiles, fused_moe
from m3bench.runtime.kernels.reference import fused_moe_ref
from m3bench.runtime.kernels.router import (
    KernelRoute,
    router_topk_align,
    routing_outputs,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON
E_ALL, N_LOCAL, FIRST, HIDDEN, INTER = 32, 8, 8, 256, 96


def _logits(local: int, seed: int) -> torch.Tensor:
    """Router logits of one token whose top-4 (by sigmoid, no bias) holds `local` of this rank's experts
    [FIRST, FIRST + N_LOCAL), the rest on other ranks, in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, E_ALL, generator=g) - 4
    mine = FIRST + torch.randperm(N_LOCAL, generator=g)[:local]
    others = torch.tensor([e for e in range(E_ALL) if not FIRST <= e < FIRST + N_LOCAL])
    others = others[torch.randperm(len(others), generator=g)[:4 - local]]
    picks = torch.cat([mine, others])[torch.randperm(4, generator=g)]
    logits[0, picks] = 2 + torch.rand(4, generator=g) * 2
    return logits


def _experts(seed: int):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (rnd(1, HIDDEN) * 2, rnd(N_LOCAL, INTER, HIDDEN) * 0.5, rnd(N_LOCAL, INTER, HIDDEN) * 0.5,
            rnd(N_LOCAL, HIDDEN, INTER) * 0.2)


def _both(x, wg, wu, wd, logits, bias, tiles, scales=None):
    """(routed in the gate|up launch: output, w, ids, alignment), (routed by router_topk_align: the same)."""
    w0, ids0, al0 = router_topk_align(logits, bias, 4, 2.0, FIRST, N_LOCAL, tiles.block_m, False)
    y0 = fused_moe(x, wg, wu, wd, ids0, w0, backend=T, tiles=tiles, scales=scales, alignment=al0)
    w1, ids1, al1 = routing_outputs(1, 4, N_LOCAL, tiles.block_m, False, x.device)
    y1 = fused_moe(x, wg, wu, wd, ids1, w1, backend=T, tiles=tiles, scales=scales, alignment=al1,
                   route=KernelRoute(logits, bias, 2.0, FIRST))
    return (y1, w1, ids1, al1), (y0, w0, ids0, al0)


def _same_routing(got, want):
    (_, w1, ids1, al1), (_, w0, ids0, al0) = got, want
    n = int(al0.n_post)
    assert int(al1.n_post) == n and torch.equal(w1, w0) and torch.equal(ids1, ids0)
    assert torch.equal(al1.sorted_ids[:n], al0.sorted_ids[:n])
    assert torch.equal(al1.block_expert[:n // 16], al0.block_expert[:n // 16])


@pytest.mark.parametrize("split_down", [1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("local", [0, 1, 2, 4])
def test_same_routing_and_bits_as_the_routers_launch(local, with_bias, split_down):
    from dataclasses import replace

    x, wg, wu, wd = _experts(local)
    logits = _logits(local, seed=10 + local)
    bias = torch.randn(E_ALL, generator=torch.Generator().manual_seed(3)) * 0.01 if with_bias else None
    tiles = replace(first_generation_tiles(1, 4, N_LOCAL, INTER, HIDDEN, False), split_down=split_down)
    assert tiles.split_k > 1 and not tiles.gemv
    got, want = _both(x, wg, wu, wd, logits, bias, tiles)
    _same_routing(got, want)
    assert int(got[3].n_post) == 16 * local
    assert torch.equal(got[0], want[0])
    ref = fused_moe_ref(x.double(), wg.double(), wu.double(), wd.double(), got[2], got[1].double())
    assert torch.allclose(got[0].double(), ref, atol=1e-4, rtol=1e-4)


def test_mxfp8_experts_route_the_same():
    from m3bench.runtime import quant
    from m3bench.runtime.kernels.moe import MoeScales, mx_split_tiles

    x, wg, wu, wd = _experts(7)
    q = [quant.quant_mxfp8(w) for w in (wg, wu, wd)]
    scales = MoeScales(q[0][1], q[1][1], q[2][1])
    got, want = _both(x.to(torch.bfloat16), q[0][0], q[1][0], q[2][0], _logits(3, seed=8), None,
                      mx_split_tiles(INTER, HIDDEN), scales)
    _same_routing(got, want)
    assert torch.equal(got[0], want[0]) and torch.isfinite(got[0].float()).all()


def test_no_router_launch_and_a_wrong_pick_shows(monkeypatch):
    """The MoE is gate|up + down + sum (the router's launch left out), and the check above can fail: routing another
    token's logits gives other picks and another output."""
    from m3bench.runtime.kernels import moe_triton, router_triton

    x, wg, wu, wd = _experts(11)
    tiles = first_generation_tiles(1, 4, N_LOCAL, INTER, HIDDEN, False)
    launches = recorded_launches(monkeypatch, (moe_triton, router_triton))
    w, ids, al = routing_outputs(1, 4, N_LOCAL, tiles.block_m, False, x.device)
    y = fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=tiles, alignment=al,
                  route=KernelRoute(_logits(2, seed=12), None, 2.0, FIRST))
    assert launches == ["moe_gate_up_kernel", "moe_down_kernel", "moe_sum_kernel"]
    other = _both(x, wg, wu, wd, _logits(2, seed=13), None, tiles)[1]
    assert not torch.equal(other[2], ids) and not torch.equal(other[0], y)


def test_refused_where_it_cannot_run():
    x, wg, wu, wd = _experts(12)
    logits = _logits(1, seed=14)
    tiles = first_generation_tiles(1, 4, N_LOCAL, INTER, HIDDEN, False)
    w, ids, al = routing_outputs(1, 4, N_LOCAL, tiles.block_m, False, x.device)
    route = KernelRoute(logits, None, 2.0, FIRST)
    with pytest.raises(ValueError, match="needs the Triton kernels"):
        fused_moe(x, wg, wu, wd, ids, w, backend=KernelBackend.TORCH, alignment=al, route=route)
    with pytest.raises(ValueError, match="one token's routed experts alone"):
        fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=tiles, route=route)  # no alignment buffers
    with pytest.raises(ValueError, match="fp32 logits of one token"):
        fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=tiles, alignment=al,
                  route=KernelRoute(logits.expand(2, -1).contiguous(), None, 2.0, FIRST))
    with pytest.raises(ValueError, match="split tiles"):
        fused_moe(x, wg, wu, wd, ids, w, backend=T, tiles=MoeTiles(16, 16, 64, gemv=True), alignment=al, route=route)
