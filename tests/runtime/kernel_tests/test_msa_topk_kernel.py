"""The MSA indexer's top-k kernel (interpreter) on crafted block scores, every path: by rank (rows of at
most RANK_BLOCKS valid blocks), by rounds over a row in registers, and by rounds over a row read in
chunks; against the selection's contract and against the kernel it replaced (benchmarks/topk_baseline_triton)."""

import math

import pytest
import torch
from benchmark_scripts import load_benchmark

from m3bench.runtime.kernels import msa_index
from m3bench.runtime.kernels.msa_index import select_top_blocks

pytestmark = pytest.mark.usefixtures("triton_interpreter")

PAGE = 16


def contract(scores: torch.Tensor, n_valid: list[int], topk: int) -> torch.Tensor:
    """The selection every path must make: the valid blocks by (score desc, block id asc), NaN scores
    left out, -inf ones kept (after every finite one), -1 past the last pick."""
    out = torch.full((*scores.shape[:2], topk), -1, dtype=torch.int32)
    for t, n in enumerate(n_valid):
        for h in range(scores.shape[1]):
            row = scores[t, h, :n].tolist()
            order = sorted((i for i in range(n) if not math.isnan(row[i])), key=lambda i: (-row[i], i))[:topk]
            out[t, h, :len(order)] = torch.tensor(order, dtype=torch.int32)
    return out


def scores_with_ties(n_tok: int, hi: int, width: int, seed: int) -> torch.Tensor:
    """Scores on a coarse grid (many ties), with +inf, 3e38, -inf, NaN, +0.0 and -0.0 sprinkled in, and
    garbage (huge values, NaN) past every row's valid blocks, which must never be picked."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-6, 7, (n_tok, hi, width), generator=g).float() / 2
    specials = torch.tensor([float("inf"), 3.0e38, float("-inf"), float("nan"), 0.0, -0.0, float("-inf")])
    pick = torch.randint(0, width, (n_tok, hi, 6), generator=g)
    s.scatter_(-1, pick, specials[torch.randint(0, len(specials), pick.shape, generator=g)])
    return s


def run_select(scores, q_lens, seq_lens, topk, fn=select_top_blocks):
    """Decode tokens and chunks: request b's tokens are its last q_lens[b] positions of seq_lens[b]."""
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = torch.full((*scores.shape[:2], topk), -7, dtype=torch.int32)
    fn(scores, out, PAGE, torch.tensor(seq_lens, dtype=torch.int32), qsl, topk, max(q_lens))
    return out


def valid_blocks(q_lens, seq_lens) -> list[int]:
    return [(n - q + t) // PAGE + 1 for q, n in zip(q_lens, seq_lens) for t in range(q)]


def garbage_past_valid(scores, n_valid):
    for t, n in enumerate(n_valid):
        scores[t, :, n:] = torch.where(torch.arange(scores.shape[-1] - n) % 2 == 0, 1e35, float("nan"))
    return scores


PATHS = {"rank": {}, "rounds": {"RANK_BLOCKS": 8}, "chunks": {"RANK_BLOCKS": 8, "MAX_TOPK_CHUNK": 16}}


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    for name, value in PATHS[request.param].items():
        monkeypatch.setattr(msa_index, name, value)
    return request.param


@pytest.mark.parametrize("topk", [4, 16])
def test_every_path_makes_the_contracts_selection(path, topk):
    # rows of 1, 3, 15 ... 44 valid blocks (fewer than topk, exactly topk, more), a 3-token chunk, 2 index heads
    q_lens, seq_lens = [1, 1, 1, 1, 3, 1], [1, 40, 16 * 15, 16 * 16 + 1, 600, 700]
    n_valid = valid_blocks(q_lens, seq_lens)
    width = max(n_valid) + 3
    scores = garbage_past_valid(scores_with_ties(len(n_valid), 2, width, seed=topk), n_valid)
    got = run_select(scores, q_lens, seq_lens, topk)
    assert torch.equal(got, contract(scores, n_valid, topk))


def test_paths_agree_with_the_replaced_kernel(path):
    """The old kernel's one-chunk rounds on the same scores (its chunked rounds dropped -inf blocks: not
    compared here, rows < MAX_TOPK_CHUNK)."""
    old = load_benchmark("topk_baseline_triton").select_top_blocks_v0
    q_lens, seq_lens = [1, 2, 1, 1], [33, 200, 16 * 40, 16 * 64]
    n_valid = valid_blocks(q_lens, seq_lens)
    scores = garbage_past_valid(scores_with_ties(len(n_valid), 3, 70, seed=5), n_valid)
    assert torch.equal(run_select(scores, q_lens, seq_lens, 16), run_select(scores, q_lens, seq_lens, 16, old))


def test_short_rows_inside_a_wide_row():
    # a CUDA-graph step's block table is as wide as the model's longest context: 64 valid blocks in a
    # 1024-wide row take the rank path of the kernel built for long rows
    q_lens, seq_lens = [1, 1, 1], [16 * 63 + 1, 16 * 128, 16 * 200]
    n_valid = valid_blocks(q_lens, seq_lens)  # 64, 128 (rank), 200 (rounds)
    scores = garbage_past_valid(scores_with_ties(3, 1, 1024, seed=7), n_valid)
    assert torch.equal(run_select(scores, q_lens, seq_lens, 16), contract(scores, n_valid, 16))


@pytest.mark.parametrize("chunk", [None, 512])
def test_rows_past_1024_blocks(monkeypatch, chunk):
    # 1100 and 1500 valid blocks: rounds over the row in registers (8 warps), or read in chunks of 512
    if chunk:
        monkeypatch.setattr(msa_index, "MAX_TOPK_CHUNK", chunk)
    q_lens, seq_lens = [1, 1], [16 * 1099 + 5, 16 * 1500]
    n_valid = valid_blocks(q_lens, seq_lens)
    scores = garbage_past_valid(scores_with_ties(2, 1, 1536, seed=11), n_valid)
    assert torch.equal(run_select(scores, q_lens, seq_lens, 16), contract(scores, n_valid, 16))


def test_all_ties_pick_the_lowest_blocks(path):
    scores = torch.zeros(2, 1, 40)
    scores[1, 0, 30:] = float("nan")  # NaN blocks are never picked, even with nothing better left
    got = run_select(scores, [1, 1], [16 * 40, 16 * 40], 16)
    assert got[0, 0].tolist() == list(range(16)) and got[1, 0].tolist() == list(range(16))
    few = run_select(torch.full((1, 1, 40), float("nan")), [1], [16 * 40], 4)
    assert few.tolist() == [[[-1, -1, -1, -1]]]


def test_the_topk_warps_rule():
    assert [msa_index.topk_warps_for(w, min(128, max(16, 1 << (w - 1).bit_length()))) for w in (10, 40, 64, 100)] \
        == [1, 2, 2, 4]
    assert msa_index.topk_warps_for(1024, 128) == 4 and msa_index.topk_warps_for(2048, 128) == 8
