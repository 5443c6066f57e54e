"""Triton MSA indexer (interpreter) vs the torch reference: scores, forced blocks, top-k."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.msa_index import msa_select_blocks
from m3bench.runtime.kernels.reference import (
    msa_block_scores_ref,
    msa_select_blocks_ref,
)

from .cases import make_case

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _select(case, topk, init_blocks=0, **kw):
    out = torch.full((case.iq.shape[0], case.iq.shape[1], topk), -7, dtype=torch.int32)
    msa_select_blocks(case.iq, case.ik_cache, case.block_tables, case.seq_lens,
                      case.query_start_loc, topk, init_blocks, out=out,
                      backend=KernelBackend.TRITON, **kw)
    want = msa_select_blocks_ref(case.iq.double(), case.ik_cache, case.block_tables,
                                 case.seq_lens, case.query_start_loc, topk, init_blocks)
    n = case.n_tokens
    assert (out[:n] != -7).all(), "some output element was not written"
    assert (out[n:] == -7).all(), "padding rows must stay untouched"
    return out[:n], want[:n]


def _local_blocks(case):
    qsl, page = case.query_start_loc.tolist(), case.ik_cache.shape[1]
    return torch.tensor([
        (n - (qsl[b + 1] - qsl[b]) + t) // page
        for b, n in enumerate(case.seq_lens.tolist()) for t in range(qsl[b + 1] - qsl[b])
    ])


@pytest.mark.parametrize("segments", [1, 3])
def test_topk_matches_reference(segments):
    # 11 blocks of 16 at most, topk 4: real selection; 3 index heads; decode and a 5-chunk.
    case = make_case(10, q_lens=[1, 5, 2], seq_lens=[170, 90, 20], hi=3, hkv=3)
    got, want = _select(case, topk=4, num_segments=segments, max_query_len=5)
    assert torch.equal(got, want)
    assert torch.equal(got[:, :, 0], _local_blocks(case)[:, None].expand(-1, 3).to(torch.int32))


def test_init_blocks_and_padding():
    # init block 0 ranks right after the local block; short contexts pad with -1.
    case = make_case(11, q_lens=[2, 1], seq_lens=[150, 40], hi=2)
    got, want = _select(case, topk=6, init_blocks=1, max_query_len=2)
    assert torch.equal(got, want)
    assert (got[:2, :, 1] == 0).all()
    assert (got[2, :, 3:] == -1).all() and sorted(got[2, 0, :3].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("fmt", [kq.KVFormat.FP8, kq.KVFormat.NVFP4])
def test_quantized_index_keys(fmt):
    case = make_case(12, q_lens=[1, 3], seq_lens=[130, 77], fmt=fmt, hi=2)
    got, want = _select(case, topk=3, num_segments=2, max_query_len=3)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", list(kq.KVFormat))
def test_whole_page_steps_at_page_128(fmt):
    # page 128: decode rows score a whole page a step, the 40-token chunk (> WHOLE_PAGE_ROWS rows) 64 keys.
    case = make_case(13, q_lens=[1, 40], seq_lens=[300, 700], fmt=fmt, hi=1, hkv=1, page=128)
    got, want = _select(case, topk=3, num_segments=2, max_query_len=40)
    assert torch.equal(got, want)


def test_block_scores_reference_by_brute_force():
    case = make_case(13, q_lens=[2], seq_lens=[35], hi=1, hkv=1)
    scores = msa_block_scores_ref(case.iq, case.ik_cache, case.block_tables, case.seq_lens,
                                  case.query_start_loc)
    page = case.ik_cache.shape[1]
    keys = torch.cat([case.ik_cache[p] for p in case.block_tables[0, :3].tolist()])
    for t, pos in enumerate([33, 34]):
        dots = case.iq[t, 0] @ keys[: pos + 1].T
        for blk in range(3):
            assert torch.isclose(scores[t, 0, blk], dots[blk * page:(blk + 1) * page].max(), atol=1e-5)
        assert torch.isinf(scores[t, 0, 3:]).all()


def test_topk_over_chunks_when_the_row_exceeds_registers(monkeypatch):
    from m3bench.runtime.kernels import msa_index

    monkeypatch.setattr(msa_index, "MAX_TOPK_CHUNK", 16)  # 40 blocks -> 3 chunks per round
    case = make_case(14, q_lens=[1, 2], seq_lens=[640, 300], hi=1, hkv=1, page=16)
    got, want = _select(case, topk=5, init_blocks=1, max_query_len=2)
    assert torch.equal(got, want)


def test_prefill_chunk_spans_several_query_blocks():
    # 4 index heads x 40 tokens -> 160 rows, capped at 128 (32 tokens): 2 query blocks.
    case = make_case(15, q_lens=[40, 2], seq_lens=[100, 70], hi=4, hkv=4)
    got, want = _select(case, topk=3, init_blocks=1, num_segments=2, max_query_len=40)
    assert torch.equal(got, want)


def test_chunked_prefill_selection_equals_whole_prompt():
    """A long prompt prefilled in chunks (each chunk's queries against every index key written so far)
    selects the same blocks as the whole prompt at once: 18 blocks, top-4, chunks of 100 tokens."""
    n, chunk = 288, 100
    case = make_case(16, q_lens=[n], seq_lens=[n], hi=1, hkv=1, page=16)
    whole, _ = _select(case, topk=4, init_blocks=1, max_query_len=n)
    parts = []
    for t0 in range(0, n, chunk):
        t1 = min(n, t0 + chunk)
        out = torch.empty((t1 - t0, 1, 4), dtype=torch.int32)
        msa_select_blocks(case.iq[t0:t1], case.ik_cache, case.block_tables, torch.tensor([t1], dtype=torch.int32),
                          torch.tensor([0, t1 - t0], dtype=torch.int32), 4, 1, out=out,
                          backend=KernelBackend.TRITON, max_query_len=t1 - t0)
        parts.append(out)
    assert torch.equal(torch.cat(parts), whole)
    assert (whole[-1] >= 0).all() and len(set(whole[-60:, 0, 2:].flatten().tolist())) > 3  # selection varies


def _poison_past_context(case):
    """NaN keys (NVFP4: NaN scales, all-ones codes) in each request's last page past its context: the scores
    kernel reads whole pages unmasked, and no selection may depend on what lies there."""
    ik, page = case.ik_cache, case.ik_cache.shape[1]
    for b, n in enumerate(case.seq_lens.tolist()):
        last, start = int(case.block_tables[b, (n - 1) // page]), n % page
        if start == 0:
            continue
        if isinstance(ik, kq.Nvfp4Pages):
            ik.data[last, start:] = 0xFF
            ik.scales[last, start:] = float("nan")
        else:
            ik[last, start:] = float("nan")
    return case


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's max over an all-NaN tile
@pytest.mark.parametrize("fmt", list(kq.KVFormat))
@pytest.mark.parametrize("q_lens, seq_lens", [([1, 1, 1], [700, 129, 512]), ([40, 1], [700, 300])])
def test_keys_past_the_context_change_no_selection(fmt, q_lens, seq_lens):
    # page 128 (decode rows: whole-page steps; the 40-token chunk: 64 keys a step), contexts that end inside a
    # page and one at its end, 3 segments a request, an init block; the top-4 of up to 6 blocks.
    case = _poison_past_context(make_case(21, q_lens=q_lens, seq_lens=seq_lens, fmt=fmt, hi=1, hkv=1, page=128))
    got, want = _select(case, topk=4, init_blocks=1, num_segments=3, max_query_len=max(q_lens))
    assert torch.equal(got, want)
    assert (got[:, :, 2] >= 0).sum() >= 2  # real selections: past the local and the init block


def test_nvfp4_scales_must_be_whole_rows():
    # the kernels load a token's d/16 scales as one vector (backend.scale_row_strides)
    case = make_case(22, q_lens=[1], seq_lens=[40], fmt=kq.KVFormat.NVFP4, hi=1, hkv=1)
    ik = case.ik_cache
    wide = torch.zeros(*ik.scales.shape[:-1], ik.scales.shape[-1] + 1, dtype=ik.scales.dtype)
    odd = kq.Nvfp4Pages(ik.data, wide[..., 1:], ik.global_scale)  # rows 1 element off a multiple of d/16
    with pytest.raises(ValueError, match="NVFP4 scales"):
        msa_select_blocks(case.iq, odd, case.block_tables, case.seq_lens, case.query_start_loc, 2,
                          backend=KernelBackend.TRITON, max_query_len=1)
