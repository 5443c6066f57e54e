"""kernels/prefetch.py: how much of its weights a decode GEMM prefetches before its PDL wait (none unless chosen,
launched with PDL and aligned), and the environment's choice. The kernels' prefetch itself: the sm90 static check
(test_pdl.py, sm90_compile.py: before the wait, and nothing else global there) and test_prefetch_gpu.py."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime import quant
from m3bench.runtime.errors import InputError
from m3bench.runtime.kernels import prefetch
from m3bench.runtime.kernels.prefetch import PREFETCH, WeightPrefetch, prefetch_inputs


@pytest.fixture
def pdl(monkeypatch):
    """Launches with PDL (as on an H200) and the mode restored after."""
    monkeypatch.setattr(prefetch, "pdl_launch", lambda t: True)
    before = PREFETCH["mode"]
    yield
    PREFETCH["mode"] = before


def _ask(mode, w, k_split=1536, block_k=128, **kw):
    PREFETCH["mode"] = mode
    return prefetch_inputs(torch.empty(1, 8), w, k_split, block_k, **kw)


def test_head_and_whole_row_major(pdl):
    w = torch.empty(1920, 6144, dtype=torch.bfloat16)
    assert _ask(WeightPrefetch.OFF, w) == 0
    assert _ask(WeightPrefetch.HEAD, w) == 256  # two BLOCK_K steps
    assert _ask(WeightPrefetch.WHOLE, w) == 1536  # the split
    assert _ask(WeightPrefetch.HEAD, w, k_split=64, block_k=64) == 64  # never past the split


def test_block_major_runs_are_a_power_of_two_of_blocks(pdl):
    w = quant.block_major(torch.empty(1920, 6144, dtype=torch.float8_e4m3fn))
    stride = 1920 * 32
    assert _ask(WeightPrefetch.WHOLE, w, block_major=True, block_stride=stride) == 1024  # 48 blocks -> 32
    assert _ask(WeightPrefetch.HEAD, w, block_major=True, block_stride=stride) == 256
    assert _ask(WeightPrefetch.WHOLE, w, k_split=4096, block_major=True, block_stride=stride) == 4096


def test_nothing_where_the_alignment_does_not_hold(pdl):
    base = torch.empty(64 * 6144 + 8, dtype=torch.bfloat16)
    shifted = base[1:1 + 64 * 6144].view(64, 6144)  # 2 bytes past an aligned start
    assert _ask(WeightPrefetch.WHOLE, shifted) == 0
    odd_rows = torch.empty(64, 40, dtype=torch.bfloat16)[:, :36]  # 80-byte rows: fine; 72-byte split: not
    assert _ask(WeightPrefetch.WHOLE, odd_rows, k_split=36, block_k=32) == 0
    assert _ask(WeightPrefetch.WHOLE, torch.empty(64, 40, dtype=torch.bfloat16), k_split=40, block_k=32) == 40


def test_nothing_without_pdl():
    before = PREFETCH["mode"]
    try:
        PREFETCH["mode"] = WeightPrefetch.WHOLE
        assert prefetch_inputs(torch.empty(1, 8), torch.empty(64, 6144), 6144, 128) == 0  # a CPU launch: no PDL
    finally:
        PREFETCH["mode"] = before


def test_mode_from_the_environment(monkeypatch):
    monkeypatch.delenv(prefetch.PREFETCH_ENV, raising=False)
    assert prefetch.prefetch_from_env() is WeightPrefetch.OFF
    monkeypatch.setenv(prefetch.PREFETCH_ENV, "whole")
    assert prefetch.prefetch_from_env() is WeightPrefetch.WHOLE
    monkeypatch.setenv(prefetch.PREFETCH_ENV, "all")
    with pytest.raises(InputError, match="M3BENCH_WEIGHT_PREFETCH='all': expected one of"):
        prefetch.prefetch_from_env()
