"""The MoE block's shared expert beside the router (layers.moe.SharedBeside) under the interpreter: the same
arithmetic in every mode where the lanes collapse to one stream (the GPU runs them concurrently:
tests/runtime/test_lanes_gpu.py). GATE_UP is OFF to the bit; WHOLE adds the shared expert in the routed sum
(fp32) and stays within rounding of OFF; all agree with the torch MoE."""

import pytest
import torch

from m3bench.runtime.config import Activation, MoeConfig
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.layers.moe import SharedBeside, SparseMoe

pytestmark = pytest.mark.usefixtures("triton_interpreter")
M = MoeConfig(num_experts=8, top_k=2, intermediate_size=32, shared_intermediate_size=64,
              routed_scaling_factor=2.0, use_routing_bias=True)


@pytest.mark.parametrize("tokens", [1, 3])
def test_every_mode_computes_the_same_block(tokens):
    moe = SparseMoe(64, M, Activation.SWIGLUOAI, 1.702, 7.0, torch.float32, "cpu")
    g = torch.Generator().manual_seed(tokens)
    for p in moe.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    x = torch.randn(tokens, 64, generator=g)
    moe.kernel_backend = KernelBackend.TRITON
    assert moe.align_fusable(x) and not moe.shared_fusable(x)
    out = {}
    for mode in SharedBeside:
        moe.shared_beside = mode
        out[mode] = moe(x)
    moe.kernel_backend = KernelBackend.TORCH
    want = moe(x)
    assert torch.equal(out[SharedBeside.GATE_UP], out[SharedBeside.OFF])
    for mode, got in out.items():
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), mode


@pytest.mark.parametrize("mode", list(SharedBeside))
def test_routing_in_the_experts_launch_is_the_same_block(mode, monkeypatch):
    """SparseMoe.route_in_experts (one token on the split tiles): the router's launch left out, the fused MoE's
    gate|up launch routes the token; the same bits as the router's launch in every mode; more tokens route as before."""
    from launch_counts import recorded_launches

    from m3bench.runtime.kernels import moe_triton, router_triton

    moe = SparseMoe(64, M, Activation.SWIGLUOAI, 1.702, 7.0, torch.float32, "cpu")
    g = torch.Generator().manual_seed(5)
    for p in moe.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    moe.kernel_backend, moe.shared_beside = KernelBackend.TRITON, mode
    for tokens in (1, 3):
        x = torch.randn(tokens, 64, generator=g)
        moe.route_in_experts = False
        want = moe(x)
        moe.route_in_experts = True
        launches = recorded_launches(monkeypatch, (moe_triton, router_triton))
        assert torch.equal(moe(x), want)
        assert ("router_align_kernel" in launches) == (tokens > 1) and "moe_gate_up_kernel" in launches
        monkeypatch.undo()
