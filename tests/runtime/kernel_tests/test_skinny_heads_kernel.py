"""The decode projection ending in its heads' norm + RoPE + cache write (Triton interpreter) against the two
launches it replaces (skinny_linear with the same tiles, then norm_rope_write / norm_rope_write_pair, each tested
against torch elsewhere): y, the query heads and every cache equal to the bit, on fresh random inputs and
poisoned caches; y also against fp64 matmul; one branch and two, split K and not, bias, a padding token."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.mx_linear import MxKernel, MxTiles, split_counters
from m3bench.runtime.kernels.norm_rope import Branch, BranchWrite, norm_rope_write, norm_rope_write_pair
from m3bench.runtime.kernels.skinny import skinny_linear
from m3bench.runtime.kernels.skinny_heads import heads_layout_ok, heads_tiles, skinny_heads, skinny_heads_supported
from m3bench.runtime.layers.rotary import RotaryEmbedding

from .cases import clone_pages, poisoned_pages, same_pages

pytestmark = pytest.mark.usefixtures("triton_interpreter")
PAGES, PAGE, D = 4, 16, 32


def _writes(caches, weights, sparse: bool, hq: int = 3, hi: int = 2):
    main = BranchWrite(Branch(0, hq * D, (hq + 1) * D, hq, 1, 1, D), weights[0], weights[1], caches[0], caches[1])
    if not sparse:
        return (main,)
    at = (hq + 2) * D
    return main, BranchWrite(Branch(at, at + hi * D, 0, hi, 1, 0, D), weights[2], weights[3], caches[2])


def _setup(fmt, sparse, m, seed, hq=3, hi=2):
    g = torch.Generator().manual_seed(seed)
    n = (hq + 2 + (hi + 1 if sparse else 0)) * D
    k = 256
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    weights = [(torch.randn(D, generator=g) * 0.2).to(torch.bfloat16) for _ in range(4)]
    caches = [poisoned_pages(fmt, shape, g) for shape in ((PAGES, 1, PAGE, D), (PAGES, 1, PAGE, D), (PAGES, PAGE, D))]
    cos, sin = RotaryEmbedding(16, 1e4, None, "cpu").cos_sin(torch.randint(0, 500, (m,), generator=g))
    slots = torch.randperm(PAGES * PAGE, generator=g)[:m]
    if m > 2:
        slots[1] = -1  # a padding row: nothing written
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    return x, w, weights, caches, cos, sin, slots, bias


CASES = [  # (fmt, sparse, rows, split_k, bias)
    (kq.KVFormat.PLAIN, False, 1, 1, False),
    (kq.KVFormat.FP8, True, 1, 4, False),
    (kq.KVFormat.FP8, True, 3, 2, True),
    (kq.KVFormat.NVFP4, True, 4, 4, False),
    (kq.KVFormat.PLAIN, True, 2, 8, False),
]


@pytest.mark.parametrize("fmt,sparse,m,split,bias", CASES)
def test_skinny_heads_equals_the_two_launches(fmt, sparse, m, split, bias):
    x, w, weights, caches, cos, sin, slots, b = _setup(fmt, sparse, m, seed=m * 31 + split + len(fmt.value))
    b = b if bias else None
    tiles = MxTiles(MxKernel.DOT, 16, D, 32, split_k=split, num_warps=4, num_stages=2)
    ours, theirs = [clone_pages(c) for c in caches], [clone_pages(c) for c in caches]
    y, outs = skinny_heads(x, w, b, _writes(ours, weights, sparse), 1e-6, True, cos, sin, slots, tiles=tiles)
    assert not split_counters(x.device).any()
    y_ref = skinny_linear(x, w, b, tiles=tiles)
    want = _writes(theirs, weights, sparse)
    if sparse:
        outs_ref = norm_rope_write_pair(y_ref, *want, 1e-6, True, cos, sin, slots)
    else:
        w0 = want[0]
        outs_ref = (norm_rope_write(y_ref, w0.branch, w0.q_weight, w0.k_weight, 1e-6, True, cos, sin, slots,
                                    w0.k_cache, w0.v_cache),)
    assert torch.equal(y, y_ref)
    fp64 = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert (y.double() - fp64).abs().max() <= 1e-2 * fp64.abs().max()
    assert len(outs) == len(outs_ref) and all(torch.equal(a, r) for a, r in zip(outs, outs_ref))
    assert all(same_pages(a, r) for a, r in zip(ours, theirs))
    if m > 2:  # the padding row's slot untouched: caches differ from the poison only at the live slots
        touched = (kq.dequantize_pages(ours[0], torch.float32) != kq.dequantize_pages(caches[0], torch.float32))
        assert touched.any(-1).sum() == (slots >= 0).sum()


def test_default_tiles_are_one_head_wide_and_fill_the_gpu():
    t = heads_tiles(1, 1920, 6144, 128, sms=132)  # a TP8 rank's q|k|v|index q|index k
    assert (t.kernel, t.block_n, t.block_k) == (MxKernel.DOT, 128, 128)
    assert 15 * t.split_k <= 1.5 * 132 and 6144 // t.split_k >= 6 * 128 and t.split_k > 1


def test_layout_and_formats_are_checked():
    x, w, weights, caches, cos, sin, slots, _ = _setup(kq.KVFormat.FP8, True, 1, seed=3)
    writes = _writes(caches, weights, True)
    assert heads_layout_ok(writes, w.shape[0]) and skinny_heads_supported(x, w, writes, 16)
    assert not heads_layout_ok(writes, w.shape[0] + D)  # a column left over
    gap = (writes[0], BranchWrite(Branch(writes[1].branch.q_col + D, writes[1].branch.k_col + D, 0, 2, 1, 0, D),
                                  *weights[2:], caches[2]))
    assert not heads_layout_ok(gap, w.shape[0])
    mixed = (writes[0], BranchWrite(writes[1].branch, *weights[2:], kq.quantize_fp8(torch.randn(PAGES, PAGE, D)).view(
        torch.uint8).to(torch.bfloat16)))
    assert not skinny_heads_supported(x, w, mixed, 16)  # bf16 index keys beside FP8 K / V
    assert not skinny_heads_supported(x.float(), w.float(), writes, 16)
    with pytest.raises(ValueError):
        skinny_heads(x, w[:-D], None, writes, 1e-6, True, cos, sin, slots)
