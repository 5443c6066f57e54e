"""MSA attention that selects its blocks in the attention launch (msa_index.BlockScores, the kernel's SELECT)
against the top-k kernel's selection fed to the same kernel (the same blocks in the same slots: the same bits) and
against the fp64 reference; every selection path (rank, rounds in registers, rounds over chunks); ties and NaN."""

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.msa_index import BlockScores, msa_block_scores
from m3bench.runtime.kernels.reference import msa_select_blocks_ref, paged_attention_ref

from .cases import make_case
from .test_msa_topk_kernel import (
    garbage_past_valid,
    path,  # noqa: F401 (the selection paths' fixture: rank, rounds, chunks)
    scores_with_ties,
    valid_blocks,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")
T = KernelBackend.TRITON

def _attend(case, sel, max_q, segments):
    out = torch.full_like(case.q, float("nan"))
    paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.query_start_loc,
                    0.3, selected_blocks=sel, out=out, max_query_len=max_q, backend=T, num_segments=segments)
    return out


def _both(case, scores, topk, max_q, segments):
    """(attention selecting in-kernel, attention over the top-k kernel's selection of the same scores)."""
    bs = BlockScores(scores, topk, case.k_cache.shape[2])
    hkv = case.k_cache.shape[1]
    fused = _attend(case, bs.expand(hkv) if scores.shape[1] != hkv else bs, max_q, segments)
    sel = bs.selected(case.seq_lens, case.query_start_loc, max_q)
    plain = _attend(case, sel.expand(-1, hkv, -1) if sel.shape[1] != hkv else sel, max_q, segments)
    return fused, plain


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("hi", [2, 1])
def test_same_bits_as_the_topk_kernels_selection(segments, hi):
    # decode tokens and a 3-token chunk; 2 KV heads, each with its own index head or one broadcast; 15-44 blocks
    case = make_case(20, q_lens=[1, 3, 1], seq_lens=[16 * 15 + 3, 16 * 30, 700], hi=hi)
    scores = msa_block_scores(case.iq, case.ik_cache, case.block_tables, case.seq_lens, case.query_start_loc,
                              max_query_len=3)
    fused, plain = _both(case, scores, 4, 3, segments)
    n = case.n_tokens
    assert torch.isfinite(fused[:n]).all() and torch.isnan(fused[n:]).all()
    assert torch.equal(fused[:n], plain[:n])


def test_matches_the_fp64_reference():
    case = make_case(21, q_lens=[1, 2], seq_lens=[16 * 20 + 5, 16 * 9], hi=2, fmt=kq.KVFormat.FP8)
    scores = msa_block_scores(case.iq, case.ik_cache, case.block_tables, case.seq_lens, case.query_start_loc,
                              max_query_len=2)
    got = _attend(case, BlockScores(scores, 4, 16), 2, 2)
    sel = msa_select_blocks_ref(case.iq.double(), case.ik_cache, case.block_tables, case.seq_lens,
                                case.query_start_loc, 4)
    want = paged_attention_ref(case.q.double(), case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                               case.query_start_loc, 0.3, sel)
    n = case.n_tokens
    assert torch.allclose(got[:n].double(), want[:n], atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("topk", [4, 16])
def test_ties_nan_and_garbage_scores(topk):
    # crafted scores (many ties, +-inf, NaN, -0.0, garbage past each row's valid blocks): the selection decides
    # which blocks are attended, so any pick that differs from the top-k kernel's changes the output
    q_lens, seq_lens = [1, 1, 2], [16 * 3 + 1, 16 * 40, 16 * 44]
    n_valid = valid_blocks(q_lens, seq_lens)
    case = make_case(22, q_lens=q_lens, seq_lens=seq_lens, hi=2)
    scores = garbage_past_valid(scores_with_ties(len(n_valid), 2, case.block_tables.shape[1], seed=topk), n_valid)
    scores = torch.cat([scores, torch.zeros(1, 2, scores.shape[-1])])  # the padding token's row
    fused, plain = _both(case, scores, topk, 2, 2)
    assert torch.equal(fused[:4], plain[:4])


def test_a_wrong_pick_shows(monkeypatch):
    """The comparison above can fail: a selection that drops the best non-local block attends elsewhere."""
    case = make_case(23, q_lens=[1], seq_lens=[16 * 30], hi=2)
    scores = msa_block_scores(case.iq, case.ik_cache, case.block_tables, case.seq_lens, case.query_start_loc,
                              max_query_len=1)
    fused, plain = _both(case, scores, 4, 1, 1)
    worse = scores.clone()
    best = worse[0, :, :29].argmax(-1)  # the local block (29) aside
    worse[0, torch.arange(2), best] = float("-inf")
    broken, _ = _both(case, worse, 4, 1, 1)
    assert torch.equal(fused[:1], plain[:1]) and not torch.equal(broken[:1], fused[:1])


def test_no_topk_launch(monkeypatch):
    """Block scores go straight to the attention: the top-k kernel runs only where a selection is materialized."""
    from m3bench.runtime.kernels import msa_index_triton

    calls = recorded_launches(monkeypatch, (msa_index_triton,), names=("topk_kernel",))
    case = make_case(24, q_lens=[1, 1], seq_lens=[16 * 12, 16 * 7 + 2], hi=1)
    scores = msa_block_scores(case.iq, case.ik_cache, case.block_tables, case.seq_lens, case.query_start_loc,
                              max_query_len=1)
    fused = _attend(case, BlockScores(scores, 4, 16).expand(2), 1, 2)
    assert not calls and torch.isfinite(fused[:2]).all()
    _, plain = _both(case, scores, 4, 1, 2)
    assert calls and torch.equal(fused[:2], plain[:2])
