"""Triton fused MoE (interpreter) vs the torch reference: align, activations, skipped experts."""

import pytest
import torch

from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import MoeActivation, MoeTiles, fused_moe, moe_align
from m3bench.runtime.kernels.reference import fused_moe_ref, moe_activation_ref

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _problem(seed, n_tok=5, top_k=2, n_exp=4, hidden=32, inter=48, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)
    ids = torch.randint(-1, n_exp + 2, (n_tok, top_k), generator=g, dtype=torch.int32)
    ids[0] = torch.arange(top_k)  # at least one local expert
    return {"x": rnd(n_tok, hidden) * 2, "w_gate": rnd(n_exp, inter, hidden) * 0.5,
            "w_up": rnd(n_exp, inter, hidden) * 0.5, "w_down": rnd(n_exp, hidden, inter) * 0.2,
            "topk_ids": ids, "topk_weights": torch.rand(n_tok, top_k, generator=g) + 0.1}


@pytest.mark.parametrize("act", [MoeActivation.SWIGLUOAI, MoeActivation.SILU])
@pytest.mark.parametrize("tiles", [MoeTiles(16, 16, 16), MoeTiles(16, 64, 128)])
def test_fused_moe_matches_reference(act, tiles):
    p = _problem(20)
    out = torch.full_like(p["x"], float("nan"))
    fused_moe(**p, activation=act, out=out, backend=KernelBackend.TRITON, tiles=tiles)
    want = fused_moe_ref(**{k: v.double() if v.is_floating_point() else v for k, v in p.items()},
                         activation=act)
    assert torch.isfinite(out).all(), "some output element was not written"
    assert torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4)


def test_token_without_local_expert_gets_zero():
    p = _problem(21)
    p["topk_ids"][1] = -1
    out = fused_moe(**p, backend=KernelBackend.TRITON, tiles=MoeTiles(16, 32, 32))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_align_segments_are_padded_and_complete():
    ids = torch.tensor([2, 0, 2, 5, -1, 2, 1, 0, 2], dtype=torch.int32)  # 5, -1: not local (E=4)
    sorted_ids, block_expert, n_post = moe_align(ids, 4, 4)
    n = int(n_post)
    assert n == 12  # expert 0: 2 -> 4 slots, 1: 1 -> 4, 2: 4 -> 4, 3: none
    assert block_expert[: n // 4].tolist() == [0, 1, 2]
    assert sorted_ids[:n].tolist() == [1, 7, 9, 9, 6, 9, 9, 9, 0, 2, 5, 8]


def test_swigluoai_clamps():
    gate = torch.tensor([10.0, -3.0, 1.0])
    up = torch.tensor([-9.0, 8.0, 0.5])
    got = moe_activation_ref(gate, up, MoeActivation.SWIGLUOAI)
    want = torch.tensor([7.0 * torch.sigmoid(torch.tensor(1.702 * 7.0)) * (-6.0),
                         -3.0 * torch.sigmoid(torch.tensor(-1.702 * 3.0)) * 8.0,
                         1.0 * torch.sigmoid(torch.tensor(1.702)) * 1.5])
    assert torch.allclose(got, want)


def test_stacked_gate_up_views_and_int64_ids():
    # The model stacks gate|up as [E, 2I, H] and passes views; its router returns int64 ids.
    p = _problem(22, n_tok=7, top_k=3, n_exp=5)
    stacked = torch.cat([p.pop("w_gate"), p.pop("w_up")], dim=1)
    inter = stacked.shape[1] // 2
    p["topk_ids"] = p["topk_ids"].long()
    got = fused_moe(**p, w_gate=stacked[:, :inter], w_up=stacked[:, inter:],
                    backend=KernelBackend.TRITON, tiles=MoeTiles(16, 32, 32))
    p64 = {k: v.double() if v.is_floating_point() else v for k, v in p.items()}
    want = fused_moe_ref(**p64, w_gate=stacked[:, :inter].double(), w_up=stacked[:, inter:].double())
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)


def test_torch_align_matches_kernel_align():
    from m3bench.runtime.kernels.moe import max_padded_pairs, moe_align_torch

    g = torch.Generator().manual_seed(23)
    ids = torch.randint(-1, 9, (300,), generator=g, dtype=torch.int32)  # E = 7: 7, 8 not local
    sorted_k, experts_k, n_k = moe_align(ids, 7, 16)
    n_slots = sorted_k.shape[0]
    assert n_slots == -(-max_padded_pairs(300, 7, 16) // 16) * 16
    sorted_t, experts_t, n_t = moe_align_torch(ids, 7, 16, n_slots)
    n = int(n_k)
    assert n == int(n_t)
    assert torch.equal(sorted_t[:n], sorted_k[:n])
    assert torch.equal(experts_t[: n // 16], experts_k[: n // 16])


def test_large_batches_align_in_torch(monkeypatch):
    from m3bench.runtime.kernels import moe

    monkeypatch.setattr(moe, "MAX_KERNEL_ALIGN_PAIRS", 4)  # force the torch align
    p = _problem(24)
    got = fused_moe(**p, backend=KernelBackend.TRITON, tiles=MoeTiles(16, 32, 32))
    want = fused_moe_ref(**{k: v.double() if v.is_floating_point() else v for k, v in p.items()})
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
