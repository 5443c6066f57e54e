"""Fused residual add + RMSNorm under the Triton interpreter against the torch path of
layers.norm.add_rms_norm (fresh random inputs, outputs poisoned first)."""

import pytest
import torch

from m3bench.runtime.config import NormKind
from m3bench.runtime.kernels.add_norm import add_rms_norm_fused
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.layers.norm import add_rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,hidden", [(NormKind.GEMMA, 96), (NormKind.PLAIN, 64)])
def test_add_norm_kernel_matches_torch(triton_interpreter, dtype, kind, hidden):
    g = torch.Generator().manual_seed(hidden)
    r = (torch.randn(7, hidden, generator=g) * 3).to(dtype)
    x = torch.randn(7, hidden, generator=g).to(dtype)
    w = (torch.randn(hidden, generator=g) * 0.3 + (1.0 if kind is NormKind.PLAIN else 0.0)).to(dtype)
    want_h, want_y = add_rms_norm(r, x, w, 1e-6, kind, KernelBackend.TORCH)
    poison = (torch.full_like(x, float("nan")), torch.full_like(x, float("nan")))
    h, y = add_rms_norm_fused(r, x, w, 1e-6, kind is NormKind.GEMMA, out=poison)
    assert h is poison[0] and torch.equal(h, want_h)  # the add rounds exactly as torch's
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.float(), want_y.float(), rtol=tol, atol=tol)
    h2, y2 = add_rms_norm(r, x, w, 1e-6, kind, KernelBackend.TRITON)  # the layer's entry picks the kernel
    assert torch.equal(h2, h) and torch.equal(y2, y)


def test_add_norm_falls_back_for_float64():
    r, x = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    h, y = add_rms_norm(r, x, torch.zeros(8, dtype=torch.float64), 1e-6, NormKind.GEMMA, KernelBackend.TRITON)
    assert torch.equal(h, r + x) and y.dtype == torch.float64
    with pytest.raises(ValueError):
        add_rms_norm_fused(r, x, torch.zeros(8, dtype=torch.float64), 1e-6, True)


@pytest.mark.parametrize("backend", [KernelBackend.TRITON, KernelBackend.TORCH])
def test_add_norm_writes_the_routers_fp32_input(triton_interpreter, backend):
    g = torch.Generator().manual_seed(5)
    r, x = (torch.randn(4, 96, generator=g) * 3).bfloat16(), torch.randn(4, 96, generator=g).bfloat16()
    w = (torch.randn(96, generator=g) * 0.3).bfloat16()
    y32 = torch.full((4, 96), float("nan"))
    h, y = add_rms_norm(r, x, w, 1e-6, NormKind.GEMMA, backend, y32_out=y32)
    assert torch.equal(y32, y.float())  # exactly what the router's cast would give
    with pytest.raises(ValueError):
        add_rms_norm_fused(r, x, w, 1e-6, True, y32_out=torch.empty(4, 96, dtype=torch.bfloat16))
