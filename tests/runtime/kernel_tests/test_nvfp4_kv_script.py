"""benchmarks/nvfp4_kv.py: the tiny CPU run end to end (checks against the references, the table and
the step estimate), and the estimate's arithmetic."""


import pytest
from benchmark_scripts import load_benchmark

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("nvfp4_kv")


def test_tiny_run_checks_and_prints_both_formats(bench, capsys):
    assert bench.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert out.count("FAILED") == 0 and out.count(": rel err") == 9  # 3 kernels x (fp8, nvfp4 x 2 decodes)
    assert "nvfp4-cvt ratio" in out and out.count("step attention") == 4


def test_step_estimate_weights_dense_and_msa_layers(bench):
    rows = [bench.Timing(k, f, 32, 1024, 1, us, 1) for k, f, us in (
        ("attn", "fp8", 10.0), ("msa-index", "fp8", 2.0), ("msa-attn", "fp8", 1.0),
        ("attn", "nvfp4", 20.0), ("msa-index", "nvfp4", 2.0), ("msa-attn", "nvfp4", 2.0))]
    assert bench.step_us(rows, "fp8", 1024) == 3 * 10 + 57 * 3
    assert bench.step_us(rows, "nvfp4", 1024) == 3 * 20 + 57 * 4
