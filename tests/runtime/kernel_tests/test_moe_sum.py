"""A fused MoE's final sum left to the residual add + norm after it (kernels/moe_sum.py, add_norm's MoE variant),
interpreter: the same bits as the sum kernel then the add + norm, one launch for both, the fp64 reference."""

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.config import NormKind
from m3bench.runtime.kernels import add_norm_triton, moe_triton
from m3bench.runtime.kernels.add_norm import add_rms_norm_fused
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeTiles, first_generation_tiles, fused_moe
from m3bench.runtime.kernels.moe_sum import MoeSum, summed
from m3bench.runtime.kernels.reference import MoeActivation, fused_moe_ref
from m3bench.runtime.layers.norm import add_rms_norm

from .test_moe_kernel import _problem as moe_problem
from .test_moe_kernel import _shared

pytestmark = pytest.mark.usefixtures("triton_interpreter")

HIDDEN, INTER, N_EXP = 256, 320, 8


def _problem(seed, n_tok, local, dtype):
    """test_moe_kernel's problem at these sizes, top-4, with `local` distinct local picks a token (the rest another
    rank's)."""
    p = moe_problem(seed, n_tok=n_tok, top_k=4, n_exp=N_EXP, hidden=HIDDEN, inter=INTER, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    p["topk_ids"] = torch.full((n_tok, 4), -1, dtype=torch.int32)
    for t in range(n_tok):
        p["topk_ids"][t, :local] = torch.randperm(N_EXP, generator=g)[:local]
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_tok", "local", "inside"), [(1, 0, False), (1, 1, False), (1, 3, False), (3, 2, True)])
def test_the_sum_in_the_add_norm_launch_gives_the_sum_kernels_bits(monkeypatch, dtype, n_tok, local, inside):
    """One token on the decode tiles (split K, the down GEMM in 2 chunks) at 0-3 local picks with an addend (the
    shared expert beside), or three tokens with the shared expert inside: the deferred sum in the add + norm's launch
    gives the bits of the sum kernel followed by the add + norm; the MoE is align, gate|up, down, and one launch."""
    p = _problem(7 * n_tok + local, n_tok, local, dtype)
    shared = _shared(3, hidden=HIDDEN, inter=64, dtype=dtype) if inside else None
    tiles = (MoeTiles(16, 32, 64, block_n_down=16, split_k=4, split_k_routed=2) if inside
             else first_generation_tiles(1, 4, N_EXP, INTER, HIDDEN, False))
    assert tiles.split_down == 2 or inside
    g = torch.Generator().manual_seed(11)
    add = None if inside else (torch.randn(n_tok, HIDDEN, generator=g) * 0.5).to(dtype)
    r = (torch.randn(n_tok, HIDDEN, generator=g) * 3).to(dtype)
    w = (torch.randn(HIDDEN, generator=g) * 0.3).to(dtype)
    y32 = torch.full((n_tok, HIDDEN), float("nan"))
    launches = recorded_launches(monkeypatch, (moe_triton, add_norm_triton))
    deferred = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared, add=add, defer_sum=True)
    assert isinstance(deferred, MoeSum) and deferred.shape == (n_tok, HIDDEN)
    h, y = add_rms_norm_fused(r, deferred, w, 1e-6, True, y32_out=y32)
    assert launches == ["moe_align_kernel", "moe_gate_up_kernel", "moe_down_kernel", "moe_sum_add_rms_norm_kernel"]
    moe_out = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared, add=add)
    want_h, want_y = add_rms_norm_fused(r, moe_out, w, 1e-6, True)
    assert torch.equal(h, want_h) and torch.equal(y, want_y) and torch.equal(y32, want_y.float())
    assert torch.equal(summed(deferred), moe_out)
    p64 = {k: v.double() if v.is_floating_point() else v for k, v in p.items()}
    ref = fused_moe_ref(**p64) + (0 if add is None else add.double())
    if inside:
        ref = ref + shared.reference(p64["x"], MoeActivation.SWIGLUOAI, 1.702, 7.0)
    ref_h, ref_y = add_rms_norm(r.double(), ref, w.double(), 1e-6, NormKind.GEMMA)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the experts' inputs and the stream rounded on the way
    for got, want in ((h, ref_h), (y, ref_y)):
        assert torch.isfinite(got).all() and (got.double() - want).norm() <= tol * want.norm()


def test_a_deferred_sum_falls_back_to_its_own_launch(monkeypatch):
    """Off the Triton path (or a dtype the kernel refuses) the layer's add + norm launches the sum first: the same h;
    a callable addend is called once, and a wrong-shaped one is refused."""
    p = _problem(5, 1, 2, torch.float32)
    tiles = first_generation_tiles(1, 4, N_EXP, INTER, HIDDEN, False)
    g = torch.Generator().manual_seed(12)
    add = torch.randn(1, HIDDEN, generator=g)
    r, w = torch.randn(1, HIDDEN, generator=g), torch.randn(HIDDEN, generator=g) * 0.3
    calls = []
    deferred = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, defer_sum=True,
                         add=lambda: calls.append(1) or add)
    launches = recorded_launches(monkeypatch, (moe_triton, add_norm_triton))
    h, y = add_rms_norm(r, deferred, w, 1e-6, NormKind.GEMMA, KernelBackend.TORCH)
    assert launches == ["moe_sum_kernel"] and calls == [1]
    fused_h, fused_y = add_rms_norm(r, deferred, w, 1e-6, NormKind.GEMMA, KernelBackend.TRITON)
    assert launches[-1] == "moe_sum_add_rms_norm_kernel" and calls == [1]
    assert torch.equal(h, fused_h) and torch.allclose(y, fused_y, atol=1e-6, rtol=1e-6)
    wrong = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, defer_sum=True, add=add[:, :8])
    with pytest.raises(ValueError, match="add must be"):
        add_rms_norm(r, wrong, w, 1e-6, NormKind.GEMMA, KernelBackend.TRITON)
    assert isinstance(fused_moe(**p, backend=KernelBackend.TORCH, defer_sum=True), torch.Tensor)  # torch: summed
