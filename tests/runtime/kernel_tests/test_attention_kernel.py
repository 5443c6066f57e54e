"""Triton paged attention (interpreter) vs the torch reference: decode, chunks, formats, MSA."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.attention import default_tile, paged_attention
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.reference import paged_attention_ref

from .cases import make_case

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _run(case, sel=None, **kw):
    out = torch.full_like(case.q, float("nan"))
    paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                    case.query_start_loc, 0.3, selected_blocks=sel, out=out,
                    backend=KernelBackend.TRITON, **kw)
    want = paged_attention_ref(case.q.double(), case.k_cache, case.v_cache, case.block_tables,
                               case.seq_lens, case.query_start_loc, 0.3, sel)
    n = case.n_tokens
    assert torch.isfinite(out[:n]).all(), "some output element was not written"
    assert torch.isnan(out[n:]).all(), "padding rows must stay untouched"
    return out[:n].double(), want[:n]


@pytest.mark.parametrize("segments", [1, 4])
def test_decode_and_chunks_fp32(segments):
    case = make_case(0, q_lens=[1, 3, 5], seq_lens=[37, 16, 70])
    got, want = _run(case, num_segments=segments, max_query_len=5)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_many_query_blocks_and_tile_32():
    # 4 heads per KV head, chunk of 11 tokens -> BLOCK_M 64 (16 tokens); page 32, tile 32.
    case = make_case(1, q_lens=[11, 2], seq_lens=[75, 40], hq=8, hkv=2, page=32)
    got, want = _run(case, num_segments=2, max_query_len=11)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", [kq.KVFormat.FP8, kq.KVFormat.NVFP4])
def test_quantized_kv_formats(fmt):
    # The reference dequantizes the same cache: the kernel's in-register decode must match.
    case = make_case(2, q_lens=[1, 4], seq_lens=[50, 33], fmt=fmt)
    got, want = _run(case, num_segments=2, max_query_len=4)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_bf16_cache_and_queries():
    case = make_case(3, q_lens=[2, 1], seq_lens=[45, 20], dtype=torch.bfloat16)
    got, want = _run(case, num_segments=1, max_query_len=2)
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)


def _random_selection(case, topk, seed):
    """Per token: its local block, then random other valid blocks, -1 padded."""
    g = torch.Generator().manual_seed(seed)
    page = case.k_cache.shape[2]
    hkv = case.k_cache.shape[1]
    sel = torch.full((case.q.shape[0], hkv, topk), -1, dtype=torch.int32)
    qsl = case.query_start_loc.tolist()
    for b, n_ctx in enumerate(case.seq_lens.tolist()):
        for t in range(qsl[b], qsl[b + 1]):
            pos = n_ctx - (qsl[b + 1] - qsl[b]) + (t - qsl[b])
            local = pos // page
            for h in range(hkv):
                others = torch.randperm(local, generator=g)[: topk - 2]  # leave one -1 slot
                sel[t, h, 0] = local
                sel[t, h, 1:1 + len(others)] = others.to(torch.int32)
    return sel


@pytest.mark.parametrize("segments", [1, 2])
def test_sparse_selected_blocks(segments):
    case = make_case(4, q_lens=[1, 3], seq_lens=[90, 64])
    sel = _random_selection(case, topk=4, seed=5)
    got, want = _run(case, sel=sel, num_segments=segments, max_query_len=3)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_sparse_with_every_block_equals_dense():
    case = make_case(6, q_lens=[2], seq_lens=[40])
    sel = torch.tensor([[0, 1, 2, -1]], dtype=torch.int32).expand(case.q.shape[0], 2, 4).contiguous()
    sparse, _ = _run(case, sel=sel, num_segments=1, max_query_len=2)
    dense, _ = _run(case, num_segments=1, max_query_len=2)
    assert torch.allclose(sparse, dense, atol=1e-6)


def test_prefill_chunk_spans_several_query_blocks():
    # G = 4, 40 query tokens -> 160 rows, capped at BLOCK_M 128 (32 tokens): 2 query blocks.
    case = make_case(7, q_lens=[40, 3], seq_lens=[40, 50], hq=8, hkv=2)
    got, want = _run(case, num_segments=2, max_query_len=40)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("segments", [1, 3])
def test_nvfp4_decode_dense_and_sparse(segments):
    """NVFP4 K/V decoded in-kernel (nibbles through the fp8 conversion): dense chunks (G = 4) and MSA blocks, both
    against the reference on the dequantized cache; fresh random data; nothing written to padding."""
    case = make_case(8 + segments, q_lens=[1, 6], seq_lens=[77, 41], hq=8, hkv=2, d=64, fmt=kq.KVFormat.NVFP4)
    got, want = _run(case, num_segments=segments, max_query_len=6)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    sel = _random_selection(case, topk=4, seed=segments)
    got, want = _run(case, sel=sel, num_segments=segments, max_query_len=6)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", list(kq.KVFormat))
@pytest.mark.parametrize("tile", [32, 64, 128])
def test_steps_of_32_64_and_128_keys_at_page_128(fmt, tile):
    """The key steps the launch rule picks on the GPU, at the real page size: dense and MSA blocks."""
    case = make_case(20 + tile, q_lens=[1, 3], seq_lens=[300, 200], hq=8, hkv=1, page=128, fmt=fmt)
    got, want = _run(case, num_segments=2, max_query_len=3, tile=tile)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    sel = _random_selection(case, topk=3, seed=tile)
    got, want = _run(case, sel=sel, num_segments=2, max_query_len=3, tile=tile)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("block_m", "programs", "sparse", "want"), [
    (16, 1, False, 64), (16, 4, False, 64), (16, 8, False, 64), (16, 16, False, 128), (32, 64, False, 128),
    (64, 64, False, 64), (64, 1, False, 64), (16, 1, True, 128), (16, 4, True, 128), (16, 8, True, 32),
    (16, 16, True, 32), (16, 32, True, 64), (16, 64, True, 128),
])
def test_key_step_rule(block_m, programs, sparse, want):
    assert default_tile(128, block_m, programs, sparse) == want
    assert default_tile(16, block_m, programs, sparse) == 16  # never more than a page


@pytest.mark.parametrize(("batch", "sparse", "tile", "segments"), [
    (1, True, 128, 8), (4, True, 128, 2), (1, False, 64, 8), (16, True, 32, 1)])
def test_few_programs_take_one_key_step_a_segment(batch, sparse, tile, segments):
    """Batch 1-4 at one KV head: whole pages (MSA) / 64 keys (dense), as many segments as key steps (up to the
    target's programs: 8 on CPU)."""
    from m3bench.runtime.kernels.attention import plan_attention

    q = torch.zeros(batch, 8, 128)
    cache = torch.zeros(64, 1, 128, 128)
    tables = torch.zeros(batch, 16, dtype=torch.int32)
    sel = torch.zeros(batch, 1, 16, dtype=torch.int32) if sparse else None
    launch = plan_attention(q, cache, tables, 1, sel, None, None)
    assert (launch.tile, launch.n_seg) == (tile, segments)
