"""Triton fused MoE (interpreter) vs the torch reference: align, activations, skipped experts."""

import pytest
import torch
from launch_counts import recorded_launches

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


def _shared(seed, hidden=32, inter=24, dtype=torch.float32):
    from m3bench.runtime.kernels.moe import SharedExpert

    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return SharedExpert(rnd(inter, hidden) * 0.5, rnd(inter, hidden) * 0.5, rnd(hidden, inter) * 0.2)


def _want(p, shared, act=MoeActivation.SWIGLUOAI):
    p64 = {k: v.double() if v.is_floating_point() else v for k, v in p.items()}
    return fused_moe_ref(**p64, activation=act) + shared.reference(p64["x"], act, 1.702, 7.0)


@pytest.mark.parametrize("n_tok", [1, 3, 7])
@pytest.mark.parametrize("act", [MoeActivation.SWIGLUOAI, MoeActivation.SILU])
def test_shared_expert_in_the_grouped_kernel(n_tok, act):
    # The shared expert runs as one more expert (weight 1) every token picks; ids n_exp and beyond are
    # other ranks' experts and must not be taken for it. 1 and 3 tokens: the split-K skinny path.
    from m3bench.runtime.kernels.moe import moe_tiles

    p = _problem(30 + n_tok, n_tok=n_tok, top_k=2, hidden=256)
    p["topk_ids"][-1, -1] = 4  # == n_exp: another rank's expert
    shared = _shared(31, hidden=256)
    assert (moe_tiles(2 * n_tok, 4, 48, 256, 24, n_tok).split_k > 1) == (n_tok <= 4)
    out = torch.full_like(p["x"], float("nan"))
    fused_moe(**p, activation=act, out=out, backend=KernelBackend.TRITON, shared=shared)
    assert torch.isfinite(out).all(), "some output element was not written"
    assert torch.allclose(out.double(), _want(p, shared, act), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tiles", [MoeTiles(16, 16, 16), MoeTiles(16, 32, 16, split_k=4, split_k_routed=2),
                                   MoeTiles(16, 16, 32, split_k=8, split_k_routed=8)])
def test_shared_expert_tiles_and_splits(tiles):
    p = _problem(40, n_tok=6, top_k=3, n_exp=5, hidden=64)
    shared = _shared(41, hidden=64, inter=40)  # 40: not a multiple of the tiles
    got = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared)
    assert torch.allclose(got.double(), _want(p, shared), atol=1e-4, rtol=1e-4)


def test_shared_expert_alone_when_no_pick_is_local():
    p = _problem(42, n_tok=2)
    p["topk_ids"][:] = -1
    shared = _shared(43)
    got = fused_moe(**p, backend=KernelBackend.TRITON, shared=shared)
    assert torch.allclose(got.double(), shared.reference(p["x"].double(), MoeActivation.SWIGLUOAI, 1.702, 7.0),
                          atol=1e-4, rtol=1e-4)


def test_skinny_tiles_fill_the_gpu_with_the_shared_expert_alone():
    from m3bench.runtime.kernels.moe import MIN_PROGRAMS, moe_tiles

    t = moe_tiles(4, 16, 3072, 6144, shared_inter=384, n_tok=1)  # one TP8/EP8 rank at batch 1
    assert t.split_k > 1 and t.split_k % t.split_k_routed == 0
    assert -(-384 // t.block_n) * t.split_k >= MIN_PROGRAMS
    assert -(-3072 // t.block_n) * t.split_k_routed >= MIN_PROGRAMS
    assert moe_tiles(256, 16, 3072, 6144, shared_inter=384, n_tok=64).split_k == 1
    from m3bench.runtime.kernels.moe import gate_up_programs  # N tiles x chunks, no idle chunk slots

    assert gate_up_programs(3072, 384, t.split_k, t) == max(96 * t.split_k_routed, 12 * t.split_k) <= 512


def test_one_token_without_the_shared_expert_splits_the_routed_experts(monkeypatch):
    """The shared expert beside (not in the fused MoE): at ROUTED_SPLIT_TOKENS tokens (1) the routed experts split K
    so one active expert's gate|up alone fills the GPU (one TP8/EP8 rank at B1), the down GEMM on 64-wide tiles
    (the H200 sweep's); more tokens, or the shared expert inside, as before; 0 turns it off."""
    from m3bench.runtime.kernels import moe
    from m3bench.runtime.kernels.moe import MIN_PROGRAMS, gate_up_programs, moe_tiles

    tiles = lambda n_tok, quantized=False, shared=0: moe.first_generation_tiles(  # noqa: E731
        n_tok, 4, 16, 3072, 6144, quantized, shared)
    assert moe.ROUTED_SPLIT_TOKENS == 1
    t = tiles(1)
    assert t == moe.routed_split_tiles(3072, 6144)
    assert (t.block_m, t.block_n, t.block_k, t.num_stages, t.n_down, t.split_k) == (16, 32, 128, 3, 64, 4)
    assert t.split_k == t.split_k_routed and 48 % t.split_k == 0  # whole K steps of 128 a chunk
    assert gate_up_programs(3072, 0, t.split_k, t) == -(-3072 // t.block_n) * t.split_k_routed >= MIN_PROGRAMS
    assert tiles(2).split_k == 1 and tiles(2) == moe_tiles(8, 16, 3072, 6144, 0, 2)
    assert tiles(1, shared=384) == moe_tiles(4, 16, 3072, 6144, 384, 1)  # the shared expert inside: its split-K
    quantized = tiles(1, True)  # MXFP8 experts: their own split tiles
    assert quantized == moe.mx_split_tiles(3072, 6144)
    assert (quantized.block_n, quantized.block_k, quantized.n_down, quantized.split_k) == (64, 128, 64, 8)
    assert -(-3072 // quantized.block_n) * quantized.split_k_routed >= MIN_PROGRAMS
    assert tiles(2, True) == moe.mx_moe_tiles(8, 16, 3072, 6144)
    monkeypatch.setattr(moe, "ROUTED_SPLIT_TOKENS", 0)
    assert tiles(1) == moe_tiles(4, 16, 3072, 6144, 0, 1) and tiles(1).split_k == 1
    assert tiles(1, True) == moe.mx_moe_tiles(4, 16, 3072, 6144)


@pytest.mark.parametrize("local", [0, 1, 2])
def test_one_token_split_routed_experts_match_the_reference(local):
    """One token, top-4 over 16 local experts + other ranks' (-1), 0-2 of them local, on the decode tiles
    first_generation_tiles gives (split K, the partials summed by the tile's last chunk): the fp64 reference."""
    from m3bench.runtime.kernels.moe import first_generation_tiles

    p = _problem(50 + local, n_tok=1, top_k=4, n_exp=16, hidden=256)
    p["topk_ids"][0] = torch.tensor([3, 9, -1, -1][:local] + [-1] * (4 - local), dtype=p["topk_ids"].dtype)
    inter = p["w_down"].shape[2]
    tiles = first_generation_tiles(1, 4, 16, inter, 256, False)
    assert tiles.split_k > 1
    out = torch.full_like(p["x"], float("nan"))
    fused_moe(**p, out=out, backend=KernelBackend.TRITON, tiles=tiles)
    want = fused_moe_ref(**{k: v.double() if v.is_floating_point() else v for k, v in p.items()})
    assert torch.isfinite(out).all() and torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("with_shared", [False, True])
def test_split_gate_up_meets_in_its_kernel_and_repeats(monkeypatch, with_shared):
    """Split K (routed experts alone at one token; the shared expert inside at a few tokens, its chunks other than
    the routed ones'): the tile's last chunk sums the partials and activates in the gate|up launch, so the MoE is
    align + gate|up + down + sum; the split counters are left zero and a second call gives the same bits."""
    from m3bench.runtime.kernels import moe_triton
    from m3bench.runtime.kernels.moe import MoeTiles, first_generation_tiles
    from m3bench.runtime.kernels.mx_linear import split_counters

    launches = recorded_launches(monkeypatch, (moe_triton,))
    n_tok = 3 if with_shared else 1
    p = _problem(70 + with_shared, n_tok=n_tok, top_k=4, n_exp=8, hidden=256, inter=96)
    p["topk_ids"][0] = torch.tensor([1, 5, -1, 6], dtype=p["topk_ids"].dtype)
    shared = _shared(72, hidden=256, inter=64) if with_shared else None
    tiles = (MoeTiles(16, 32, 64, block_n_down=16, split_k=4, split_k_routed=2) if with_shared
             else first_generation_tiles(1, 4, 8, 96, 256, False))
    assert tiles.split_k > 1 and (not with_shared or tiles.split_k != tiles.split_k_routed)
    got = fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared)
    assert launches == ["moe_align_kernel", "moe_gate_up_kernel", "moe_down_kernel", "moe_sum_kernel"]
    assert not split_counters(p["x"].device).any()
    assert torch.equal(fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared), got)
    want = _want(p, shared) if with_shared else fused_moe_ref(
        **{k: v.double() if v.is_floating_point() else v for k, v in p.items()})
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)


def test_shared_align_with_torch_align(monkeypatch):
    from m3bench.runtime.kernels import moe

    ids = torch.tensor([2, 0, 4, 5, -1, 2], dtype=torch.int32)  # E = 4: 4, 5, -1 not local
    sk, ek, nk = moe_align(ids, 4, 4, n_shared=3)
    monkeypatch.setattr(moe, "MAX_KERNEL_ALIGN_PAIRS", 2)
    st, et, nt = moe_align(ids, 4, 4, n_shared=3)
    n = int(nk)
    assert n == int(nt) == 12  # expert 0: 1 -> 4, 2: 2 -> 4, shared (4): 3 -> 4
    assert ek[: n // 4].tolist() == et[: n // 4].tolist() == [0, 2, 4]
    assert sk[:n].tolist() == st[:n].tolist() == [1, 9, 9, 9, 0, 5, 9, 9, 6, 7, 8, 9]


def test_add_joins_the_final_sum_and_a_callable_is_called_once():
    p = _problem(31)
    add = torch.randn(p["x"].shape, generator=torch.Generator().manual_seed(3))
    want = fused_moe_ref(**{k: v.double() if v.is_floating_point() else v for k, v in p.items()},
                         activation=MoeActivation.SWIGLUOAI) + add.double()
    calls = []

    def late():
        calls.append(1)
        return add

    for given in (add, late):
        out = fused_moe(**p, backend=KernelBackend.TRITON, tiles=MoeTiles(16, 16, 16), add=given)
        assert torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4)
    assert calls == [1]
    ref = fused_moe(**p, backend=KernelBackend.TORCH, add=add)
    assert torch.allclose(ref.double(), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="add must be"):
        fused_moe(**p, backend=KernelBackend.TRITON, tiles=MoeTiles(16, 16, 16), add=add[:, :8])


@pytest.mark.parametrize(("split_down", "chunks"), [(2, 2), (3, 3), (4, 3)])
@pytest.mark.parametrize("local", [0, 1, 3])
def test_down_gemm_split_k_chunks_summed_by_the_sum_kernel(monkeypatch, local, split_down, chunks):
    """MoeTiles.split_down: the down GEMM's reduction in chunks of whole K steps (fp32 partials a chunk, the last
    one shorter; 320 inputs in steps of 128: at most 3), summed by the sum kernel with no launch more: the fp64
    reference at 0-3 local picks, the unsplit result within fp32 rounding; the one-token split tiles take
    ROUTED_SPLIT_DOWN chunks; a shared expert inside refuses it."""
    from dataclasses import replace

    from m3bench.runtime.kernels import moe, moe_triton
    from m3bench.runtime.kernels.moe import SharedExpert, first_generation_tiles

    p = _problem(90 + local, n_tok=1, top_k=4, n_exp=8, hidden=256, inter=320)
    p["topk_ids"][0] = torch.tensor([1, 5, 6, -1][:local] + [-1] * (4 - local), dtype=p["topk_ids"].dtype)
    monkeypatch.setattr(moe, "ROUTED_SPLIT_DOWN", split_down)
    tiles = first_generation_tiles(1, 4, 8, 320, 256, False)
    assert tiles.split_down == min(split_down, 3) and tiles.split_k > 1
    launches = recorded_launches(monkeypatch, (moe_triton,), ("moe_down_kernel", "moe_sum_kernel"), grids=True)
    out = torch.full_like(p["x"], float("nan"))
    fused_moe(**p, out=out, backend=KernelBackend.TRITON, tiles=tiles)
    assert [n for n, _ in launches] == ["moe_down_kernel", "moe_sum_kernel"] and launches[0][1][2] == chunks
    want = fused_moe_ref(**{k: v.double() if v.is_floating_point() else v for k, v in p.items()})
    assert torch.isfinite(out).all() and torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4)
    whole = fused_moe(**p, backend=KernelBackend.TRITON, tiles=replace(tiles, split_down=1))
    assert torch.allclose(out, whole, atol=1e-5, rtol=1e-5)
    shared = SharedExpert(p["w_gate"][0], p["w_up"][0], p["w_down"][0])
    with pytest.raises(ValueError, match="splits K for routed experts alone"):
        fused_moe(**p, backend=KernelBackend.TRITON, tiles=tiles, shared=shared)
