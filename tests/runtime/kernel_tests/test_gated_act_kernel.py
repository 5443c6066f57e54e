"""The gated activation of a fused gate|up projection in one Triton launch (interpreter) against the torch
path (layers.activation.split_gate_up), fresh random inputs beyond the SwiGLU-OAI clamp."""

import pytest
import torch

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.gated_act import gated_act, gated_act_supported
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.layers.activation import split_gate_up

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.mark.parametrize("act", [Activation.SWIGLUOAI, Activation.SILU])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_gated_act_matches_torch(act, dtype, tol):
    g = torch.Generator().manual_seed(len(act.value))
    gu = (torch.randn(5, 2 * 1100, generator=g) * 6).to(dtype)  # 1100: two column blocks, the last partial
    want = split_gate_up(gu.double(), act, 1.702, 7.0)
    got = gated_act(gu, MoeActivation(act.value), 1.702, 7.0)
    assert got.dtype == dtype and got.shape == (5, 1100)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_gated_act_refuses_what_it_cannot_read():
    assert not gated_act_supported(torch.zeros(3, 7))  # odd width
    assert not gated_act_supported(torch.zeros(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError):
        gated_act(torch.zeros(4, 8)[:, ::2], MoeActivation.SILU, 0.0, 0.0)
