"""benchmarks/attn_segments.py: the tiny run end to end (interpreter), the rule's pick among the rows, and an
output that differs from the rule's failing it."""

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("attn_segments")


def test_tiny_run_times_every_step_and_segment_count(bench, triton_interpreter, capsys):
    assert bench.main(["--tiny", "--batches", "1"]) == 0
    out = capsys.readouterr().out
    assert "msa B=1: best tile" in out and "dense B=1: best tile" in out and "<- rule" in out


def test_an_output_off_the_rules_fails_the_run(bench, monkeypatch, triton_interpreter):
    attend = bench._attend

    def off(pool, bt, sh, sel, out, tile=None, segments=None):
        got = attend(pool, bt, sh, sel, out, tile, segments)
        return got if segments is None else got + torch.ones_like(got)

    monkeypatch.setattr(bench, "_attend", off)
    assert bench.main(["--tiny", "--batches", "1"]) == 1
