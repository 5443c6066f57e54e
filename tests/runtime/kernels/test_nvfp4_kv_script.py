"""benchmarks/nvfp4_kv.py: the tiny CPU run end to end (checks against the references, the table and
the step estimate), and the estimate's arithmetic."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("nvfp4_kv", BENCH / "nvfp4_kv.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nvfp4_kv"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


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
