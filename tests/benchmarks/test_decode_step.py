"""benchmarks/decode_step.py (+ decode_floor.py): the bytes / floor arithmetic, the layer fit, the decode metadata,
and a CPU smoke run of the whole script (tiny shapes, torch paths)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def fl():
    sys.path.insert(0, str(BENCH))  # the script's helper modules import each other by name
    return importlib.import_module("decode_floor")


@pytest.fixture(scope="module")
def ds(fl):
    spec = importlib.util.spec_from_file_location("decode_step", BENCH / "decode_step.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["decode_step"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_distinct_experts_matches_performance_md(fl):
    assert fl.distinct_experts(128, 4, 1) == pytest.approx(4.0)
    assert round(fl.distinct_experts(128, 4, 16)) == 51
    assert round(fl.distinct_experts(128, 4, 64)) == 111
    assert fl.distinct_experts(16, 4, 0) == 0
    assert fl.distinct_experts(16, 4, 64) == pytest.approx(16, abs=1e-6)


def test_weight_bytes_per_layer(fl):
    s = fl.M3Shapes()
    norms = 2 * 128 + 2 * 6144
    dense_attn = ((8 + 2) * 128 * 6144 + 6144 * 8 * 128 + norms) * 2
    assert fl.attn_weight_bytes(s, sparse=False) == dense_attn
    assert fl.attn_weight_bytes(s, sparse=True) == dense_attn + (2 * 128 * 6144 + 2 * 128) * 2
    assert fl.expert_bytes(s) == 3 * 3072 * 6144 * 2
    one_dense = fl.weight_bytes_read(s, 1, 1)
    head = 25008 * 6144 * 2 + 6144 * 2 + 6144 * 2  # lm_head, one embedding row, final norm
    assert one_dense == head + dense_attn + 3 * 1536 * 6144 * 2
    four = fl.weight_bytes_read(s, 4, 16)
    moe = fl.attn_weight_bytes(s, True) + fl.moe_fixed_bytes(s) + fl.distinct_experts(16, 4, 16) * fl.expert_bytes(s)
    assert four == pytest.approx(fl.weight_bytes_read(s, 3, 16) + moe)


def test_kv_and_index_bytes(fl):
    s = fl.M3Shapes()  # layers 0-2 dense, 3.. MSA; fp8: K+V of one head = 256 bytes a token
    assert fl.kv_bytes_read(s, 4, 2, 8192) == 3 * 2 * 8192 * 256 + 2 * 2048 * 256
    assert fl.kv_bytes_read(s, 4, 2, 1000) == 4 * 2 * 1000 * 256  # context below 16 blocks
    assert fl.index_bytes_read(s, 5, 3, 8192) == 2 * 3 * 8192 * 128
    f = fl.floor_of(s, 5, 3, 8192)
    assert f.ms == pytest.approx((f.weights_bytes + f.kv_bytes + f.index_bytes) / 4.3e12 * 1e3)


def test_layers_that_fit_is_the_largest_within_budget(fl):
    s = fl.M3Shapes()
    n = fl.layers_that_fit(s, 64, 32768, 120e9)
    assert fl.resident_bytes(s, n, 64, 32768) <= 120e9 < fl.resident_bytes(s, n + 1, 64, 32768)
    assert 30 < n < 60


def test_decode_meta_slots(ds):
    s = ds.M3Shapes()
    meta = ds.decode_meta(s, 3, 130, torch.device("cpu"))
    assert meta.block_tables.shape == (3, 2)
    assert meta.slot_mapping.tolist() == [(2 * b + 1) * 128 + 2 for b in range(3)]
    assert meta.seq_lens.tolist() == [131] * 3 and meta.positions.tolist() == [130] * 3


def test_cpu_smoke_run_writes_json(ds, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert ds.main(["--cpu-smoke", "--skip-baselines", "--skip-checks"]) == 0
    res = json.loads((tmp_path / "decode_step.json").read_text())
    assert len(res["m3"]) == 4 and all(r["finite"] and r["step_ms"] > 0 for r in res["m3"])
    assert "floor ms" in capsys.readouterr().out.splitlines()[-5]
