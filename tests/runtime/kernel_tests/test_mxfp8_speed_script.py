"""benchmarks/mxfp8_speed.py: its table and goal column on known rows, and the tiny run end to end (interpreter)."""

import json
from dataclasses import replace

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("mxfp8_speed")


def test_rows_give_floor_share_speedup_and_goal(bench, monkeypatch):
    import decode_floor

    monkeypatch.setitem(decode_floor.BANDWIDTH, "bytes_per_s", 4.0e12)  # as a GPU run measuring 4.0 TB/s sets it
    n, k = 6144, 3072 * 3  # 56.6 MB of weights: 14.2 us at 4.0 TB/s

    def row(kernel, batch, bf16_us, runtime_us, new_us=16.0, alt_us=None, **kw):
        return bench.Row(kernel, "mxfp8", batch, n * k, bf16_us, runtime_us, 60.0, new_us, alt_us, 1e-3, 2e-3, 3e-3,
                         **kw)

    moe = row("moe-local", 16, 40.0, 16.0)
    assert moe.pct_floor == pytest.approx(100 * n * k / 4.0e12 / 16e-6) and moe.speedup == pytest.approx(2.5)
    assert bench.goal(moe) == "ok"
    assert bench.goal(row("moe-local", 16, 25.0, 16.0)) == "MISS"  # 1.56x
    assert bench.goal(row("moe-local", 1, 25.0, 16.0)) == "ok"  # batch 1
    assert bench.goal(row("qkv", 1, 99.0, 20.0)) == "MISS"  # 71%
    assert bench.goal_summary([moe]) == ("goals met: MXFP8 1/1 rows, NVFP4 0/0 rows; memory-bound MXFP8 rows "
                                         "(moe-local, batch >= 16) 1/1")
    line = bench.markdown_table([moe]).splitlines()[-1]
    assert line == ("| moe-local | mxfp8 | 16 | 40.0 | 16.0 | 88% | - | - | 2.50x | 60.0 | 16.0 | - | 1.0e-03 | "
                    "2.0e-03 | 3.0e-03 | ok |")
    linear = row("qkv", 1, 40.0, 16.0, alt_us=20.0, read_us=12.0)
    assert linear.pct_read == pytest.approx(75.0)
    assert "| 40.0 | 16.0 | 88% | 12.0 | 75% | 2.50x |" in bench.table_line(linear)


def test_the_goal_is_the_runtime_kernels_not_another(bench, monkeypatch):
    """A fast kernel the runtime does not run ("new") meets no goal: the figures are the runtime column's."""
    import decode_floor

    monkeypatch.setitem(decode_floor.BANDWIDTH, "bytes_per_s", 4.0e12)
    n, k = 6144, 3072 * 3
    slow_runtime = bench.Row("moe-local", "mxfp8", 16, n * k, 40.0, 30.0, 60.0, 16.0, None, 1e-3, 1e-3, 1e-3)
    assert bench.goal(slow_runtime) == "MISS" and slow_runtime.speedup == pytest.approx(40 / 30)
    assert bench.goal(replace(slow_runtime, runtime_us=16.0)) == "ok"


def test_tiny_run_times_every_kernel_and_writes_json(bench, tmp_path, triton_interpreter):
    out = tmp_path / "speed.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {(r["kernel"], r["fmt"], r["batch"]) for r in rows} >= {("qkv", "mxfp8", 1), ("o", "mxfp8", 3),
                                                                  ("moe-local", "nvfp4", 3), ("moe-ep", "mxfp8", 1)}
    assert all(r["err_runtime"] < 2e-2 and r["err_new"] < 2e-2 and r["err_old"] < 2e-2 for r in rows)
    assert all(r["runtime_us"] > 0 and r["new_us"] > 0 and r["old_us"] > 0 for r in rows)
    assert all(r["read_us"] > 0 and r["pct_read"] > 0 for r in rows)  # NaN compares False
    assert all((r["alt_us"] is not None) == (r["kernel"] in ("qkv", "o") and r["batch"] == 1) for r in rows)


def test_a_wrong_kernel_fails_the_run(bench, monkeypatch, triton_interpreter):
    """An MXFP8 GEMM 5% off (a scale read one block late would be far worse) makes the run exit 1."""
    def off(x, w, s, **kw):
        return bench.F.linear(x, bench.quant.dequant_mxfp8(w, s, x.dtype)) * 1.05
    assert bench.main(["--tiny", "--only", "linear"]) == 0
    monkeypatch.setattr(bench, "mxfp8_linear", off)
    assert bench.main(["--tiny", "--only", "linear"]) == 1


def test_a_kernel_that_raises_reads_nan_and_fails_the_run(bench, monkeypatch, capsys, triton_interpreter):
    def broken(*args, **kw):
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(bench, "mxfp8_linear", broken)
    assert bench.main(["--tiny", "--only", "linear"]) == 1
    out = capsys.readouterr()
    assert "FAILED: RuntimeError: out of resource" in out.err and "| nan |" in out.out
