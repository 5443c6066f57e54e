"""benchmarks/mxfp8_gpu.py: the table generator on known rows, and the tiny run end to end (interpreter)."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("mxfp8_gpu")


def test_table_rows_give_peak_share_and_speedup(bench):
    n, k = 1536, 6144
    rows = [bench.Row("qkv", "bf16", 1, 10.0, n * k * 2), bench.Row("qkv", "mxfp8", 1, 5.0, int(n * k * 33 / 32))]
    assert rows[0].pct_peak == pytest.approx(100 * n * k * 2 / 10e-6 / 4.3e12)
    line = bench.markdown_table(rows).splitlines()[-1]
    assert line.startswith("| qkv | 1 | 10.0 |") and line.endswith("| 2.00x |")
    rows.append(bench.Row("qkv", "nvfp4", 1, 4.0, 1))
    assert bench.markdown_table(rows).splitlines()[-1].endswith("| 2.00x | 4.0 | 0% | 2.50x |")


def test_tiny_run_checks_pass_and_writes_json(bench, tmp_path, triton_interpreter):
    out = tmp_path / "mx.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert all(v < 2e-2 for v in d["checks"].values()) and len(d["checks"]) == 4
    kernels = {(r["kernel"], r["weights"]) for r in d["kernels"]}
    assert {("moe-local", "mxfp8"), ("moe-ep", "nvfp4"), ("qkv", "bf16")} <= kernels
