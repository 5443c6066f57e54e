"""benchmarks/prefill_long.py: the floor arithmetic by hand, and the CPU smoke run (tiny shapes; the H200
figures are the GPU run's, not this test's)."""

import importlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_floor_arithmetic_by_hand():
    bench = importlib.import_module("prefill_long")
    from decode_floor import TINY

    assert bench.sparse_keys_sum(5, 2) == 1 + 2 + 2 + 2 + 2 and bench.sparse_keys_sum(3, 8) == 6
    s, layers, L = TINY, 3, 300  # 1 dense + 2 MSA layers; chunks end at 128, 256, 300
    b = bench.prefill_bytes(s, layers, L, 128, weight_bytes=1000.0)
    kv_tok = 2 * s.kv_heads * s.head_dim * s.kv_bytes
    assert b["weights"] == 3000.0
    assert b["index_keys"] == (128 + 256 + 300) * s.index_dim * s.kv_bytes * 2
    assert b["selected_blocks"] == 3 * s.topk_blocks * s.page * kv_tok * 2
    assert b["dense_kv"] == (128 + 256 + 300) * kv_tok
    f = bench.prefill_flops(s, layers, L)
    assert f["indexer"] == pytest.approx(2 * 2.0 * s.index_heads * s.index_dim * L * (L + 1) / 2)
    assert f["dense_attention"] == pytest.approx(4.0 * s.heads * s.head_dim * L * (L + 1) / 2)
    floor = bench.PrefillFloor(790e12, 0.0)
    assert floor.ms == pytest.approx(1000.0)


def test_cpu_smoke(tmp_path, capsys):
    bench = importlib.import_module("prefill_long")
    out = tmp_path / "p.json"
    assert bench.main(["--cpu-smoke", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["context"] for r in rows] == [256, 640]
    assert all(r["ttft_ms"] > 0 and r["tok_per_s"] > 0 and r["floor_ms"] > 0 for r in rows)
    assert "TTFT ms" in capsys.readouterr().out
