"""The fused router epilogue (sigmoid + bias + top-k + renormalise + scale) under the Triton
interpreter against the torch path of layers.moe.route, on fresh random inputs."""

import pytest
import torch

from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.router import router_topk, router_topk_supported
from m3bench.runtime.layers.moe import route


@pytest.mark.parametrize("n_tok,n_exp,k,bias", [(1, 128, 4, True), (37, 16, 4, True), (5, 32, 3, False)])
def test_router_kernel_matches_torch_route(triton_interpreter, n_tok, n_exp, k, bias):
    g = torch.Generator().manual_seed(n_tok * 100 + n_exp)
    x = torch.randn(n_tok, 48, generator=g)
    w = torch.randn(n_exp, 48, generator=g)
    b = torch.randn(n_exp, generator=g) * 0.5 if bias else None
    want_w, want_ids = route(x, w, b, k, 2.0, KernelBackend.TORCH)
    poison = (torch.full((n_tok, k), float("nan")), torch.full((n_tok, k), -7, dtype=torch.int64))
    got_w, got_ids = route(x, w, b, k, 2.0, KernelBackend.TRITON)  # the kernel through the layer's entry
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-6)
    logits = torch.nn.functional.linear(x, w)
    got = router_topk(logits, b, k, 2.0, out=poison)
    assert got[0] is poison[0] and torch.equal(poison[1], want_ids)
    torch.testing.assert_close(poison[0], want_w, rtol=1e-6, atol=1e-6)
    assert torch.allclose(poison[0].sum(-1), torch.full((n_tok,), 2.0))


def test_router_kernel_breaks_ties_toward_the_lowest_expert(triton_interpreter):
    logits = torch.zeros(2, 16)
    logits[0, [3, 9, 12]] = 5.0  # three equal winners, then ties among the rest
    w, ids = router_topk(logits, None, 4, 1.0)
    assert ids[0].tolist() == [3, 9, 12, 0] and ids[1].tolist() == [0, 1, 2, 3]
    assert torch.allclose(w[1], torch.full((4,), 0.25))


def test_router_kernel_shape_limits():
    assert router_topk_supported(torch.zeros(2, 128), 4)
    assert not router_topk_supported(torch.zeros(2, 96), 4)  # not a power of two: torch path
    assert not router_topk_supported(torch.zeros(2, 128, dtype=torch.float64), 4)
    with pytest.raises(ValueError):
        router_topk(torch.zeros(2, 96), None, 4, 1.0)


@pytest.mark.parametrize("n_tok,first,shared", [(1, 0, True), (3, 16, True), (16, 48, False), (5, 112, True)])
def test_router_align_equals_router_then_moe_align(triton_interpreter, n_tok, first, shared):
    # One TP8/EP8 rank owns experts [first, first + 16) of 128: the fused launch must give router_topk's
    # weights, the local ids, and moe_align's layout of them (+ the shared expert's pairs) exactly.
    check_router_align(torch.device("cpu"), n_tok, first, shared)


def check_router_align(dev: torch.device, n_tok: int, first: int, shared: bool, n_exp: int = 128,
                       local_bias: float = 0.4) -> None:
    """router_topk_align on `dev` == router_topk, then moe_align of the local ids (the unfused launches)."""
    from m3bench.runtime.kernels.moe import moe_align
    from m3bench.runtime.kernels.router import router_topk_align

    g = torch.Generator().manual_seed(n_tok + first)
    logits, b = torch.randn(n_tok, n_exp, generator=g), torch.randn(n_exp, generator=g) * 0.5
    b[first:first + 16] += local_bias  # some picks local (all of them with 16 experts)
    logits, b = logits.to(dev), b.to(dev)
    want_w, want_ids = router_topk(logits, b, 4, 2.0)
    w, ids, al = router_topk_align(logits, b, 4, 2.0, first, 16, 16, shared)
    assert torch.equal(ids, want_ids - first)
    sorted_ids, block_expert, n_post = moe_align(ids.reshape(-1), 16, 16, n_tok if shared else 0)
    n = int(n_post)
    assert int(al.n_post) == n and al.sorted_ids.shape == sorted_ids.shape
    assert torch.equal(al.sorted_ids[:n], sorted_ids[:n])
    assert torch.equal(al.block_expert[: n // 16], block_expert[: n // 16])
    # exact in the interpreter; on a GPU the two kernels' row tiles differ (BLOCK_T), so the renormalising
    # sums may round differently in the last bit (H200: <= 2.4e-7 relative)
    tol = 0 if dev.type == "cpu" else 1e-6
    torch.testing.assert_close(w, want_w, rtol=tol, atol=tol / 10)
