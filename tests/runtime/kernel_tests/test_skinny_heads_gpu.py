"""The projection ending in its heads' norm / RoPE / cache write (kernels.skinny_heads) on the GPU at one TP8
rank's real shapes: equal to the bit to the two launches it replaces with the same tiles (skinny_linear, then
norm_rope_write_pair), for every KV format, 1-4 rows (HEADS_MAX_ROWS); repeatable in a CUDA graph (the split
counters left zero). The rank's whole decode step with it (ops set skinny-pdl-side-whole-heads):
tests/benchmarks/test_decode_pdl_gpu.py."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.mx_linear import split_counters
from m3bench.runtime.kernels.norm_rope import Branch, BranchWrite, norm_rope_write_pair
from m3bench.runtime.kernels.skinny import skinny_linear
from m3bench.runtime.kernels.skinny_heads import heads_tiles, skinny_heads

from .cases import clone_pages, poisoned_pages, same_pages

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
D, PAGES, PAGE = 128, 40, 128


def _caches(fmt, g):
    return [poisoned_pages(fmt, shape, g, device="cuda") for shape in ((PAGES, 1, PAGE, D), (PAGES, 1, PAGE, D),
                                                                        (PAGES, PAGE, D))]


def _writes(caches, w):
    return (BranchWrite(Branch(0, 8 * D, 9 * D, 8, 1, 1, D), w[0], w[1], caches[0], caches[1]),
            BranchWrite(Branch(10 * D, 14 * D, 0, 4, 1, 0, D), w[2], w[3], caches[2]))


def _inputs(rows, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, 6144, device="cuda", generator=g).to(torch.bfloat16)
    wq = (torch.randn(15 * D, 6144, device="cuda", generator=g) * 6144 ** -0.5).to(torch.bfloat16)
    norms = [(torch.randn(D, device="cuda", generator=g) * 0.2).to(torch.bfloat16) for _ in range(4)]
    ang = torch.rand(rows, 32, device="cuda", generator=g) * 6.28
    slots = torch.randperm(PAGES * PAGE, device="cuda", generator=g)[:rows]
    return x, wq, norms, ang.cos(), ang.sin(), slots, _caches(fmt, g)


@pytest.mark.parametrize("fmt", [kq.KVFormat.PLAIN, kq.KVFormat.FP8, kq.KVFormat.NVFP4])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_equal_to_the_two_launches_at_rank_shapes(fmt, rows):
    x, wq, norms, cos, sin, slots, caches = _inputs(rows, fmt, rows * 3 + len(fmt.value))
    tiles = heads_tiles(rows, wq.shape[0], 6144, D, torch.cuda.get_device_properties(0).multi_processor_count)
    ours, theirs = [clone_pages(c) for c in caches], [clone_pages(c) for c in caches]
    y, outs = skinny_heads(x, wq, None, _writes(ours, norms), 1e-6, True, cos, sin, slots)
    y_ref = skinny_linear(x, wq, tiles=tiles)
    outs_ref = norm_rope_write_pair(y_ref, *_writes(theirs, norms), 1e-6, True, cos, sin, slots)
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref)
    assert (y.float() - x.float() @ wq.float().T).abs().max() <= 1e-2 * y_ref.float().abs().max()
    assert all(torch.equal(a, b) for a, b in zip(outs, outs_ref))
    assert all(same_pages(a, b) for a, b in zip(ours, theirs))
    assert not split_counters(x.device).any()


def test_replays_in_a_cuda_graph_repeat():
    x, wq, norms, cos, sin, slots, caches = _inputs(1, kq.KVFormat.FP8, 11)
    writes = _writes(caches, norms)
    first = skinny_heads(x, wq, None, writes, 1e-6, True, cos, sin, slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_heads(x, wq, None, writes, 1e-6, True, cos, sin, slots)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], first[0]) and all(torch.equal(a, b) for a, b in zip(out[1], first[1]))
    assert not split_counters(x.device).any()
