"""benchmarks/mxfp8_gpu.py: the table generator on known rows, and the tiny run end to end (interpreter)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "mxfp8_gpu.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("mxfp8_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mxfp8_gpu"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


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
