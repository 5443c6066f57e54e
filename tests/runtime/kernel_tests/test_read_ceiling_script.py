"""benchmarks/read_ceiling.py: the read kernel reads every word once (its xor), on CPU under the interpreter."""

import math

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("read_ceiling")


@pytest.mark.parametrize("words, programs, block_w", [(1000, 4, 64), (4096, 8, 128), (777, 3, 256)])
def test_read_xors_every_word_once(bench, triton_interpreter, words, programs, block_w):
    gen = torch.Generator().manual_seed(words)
    src = torch.randint(-(1 << 31), 1 << 31, (words,), dtype=torch.int32, generator=gen)
    out = torch.zeros(64, dtype=torch.int32)
    bench.read(src, out, programs, block_w, 4)
    want = 0
    for v in src.tolist():
        want ^= v
    assert bench.xor_of(out) == bench.xor_of(src) == want


def test_xor_of_sees_one_word_changed(bench):
    src = torch.arange(1, 1001, dtype=torch.int32)
    changed = src.clone()
    changed[517] ^= 1 << 30
    assert bench.xor_of(src) != bench.xor_of(changed)


def test_read_us_checks_the_read_and_times_the_best_grid(bench, triton_interpreter, monkeypatch):
    us, grid = bench.read_us(20000, torch.device("cpu"))
    assert math.isfinite(us) and us > 0 and "programs" in grid
    bench.read_us.cache_clear()
    monkeypatch.setattr(bench, "read", lambda src, out, *a: out.zero_())  # a read that reads nothing
    with pytest.raises(RuntimeError, match="wrong xor"):
        bench.read_us(20000, torch.device("cpu"))
    bench.read_us.cache_clear()
