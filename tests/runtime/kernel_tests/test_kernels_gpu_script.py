"""benchmarks/kernels_gpu.py: its CPU-testable pieces (bytes model, tiny checks end to end)."""


import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("kernels_gpu")


def test_kv_bytes_per_token(bench):
    assert bench.kv_bytes_per_token("bf16", 128) == 256
    assert bench.kv_bytes_per_token("fp8", 128) == 128
    assert bench.kv_bytes_per_token("nvfp4", 128) == 72  # 64 data + 8 scales


def test_attention_bytes_count_whole_context_or_selected_blocks(bench):
    sh = bench.Shapes()
    act = 2 * 4 * 8 * 128 * 2  # q in, out (bf16)
    assert bench.attn_bytes("bf16", 4, 4, 8192, sh, sparse=False) == 4 * 8192 * 2 * 256 + act
    assert bench.attn_bytes("bf16", 4, 4, 8192, sh, sparse=True) == 4 * 2048 * 2 * 256 + act
    assert bench.attn_bytes("nvfp4", 1, 4, 1000, sh, sparse=True) == 4 * 1000 * 2 * 72 + act


def test_index_bytes_read_every_key_once_per_request(bench):
    sh = bench.Shapes()
    assert bench.index_bytes("fp8", 2, 8, 1280, sh) == 2 * 1280 * 128 + 2 * 8 * 10 * 4 + 8 * 128 * 2


def test_copies_keep_caches_cold(bench, monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    assert bench.n_copies(10**6) == 160 and bench.n_copies(10**9) == 4 and bench.n_copies(1) == 256


def test_moe_bytes_count_distinct_local_experts(bench):
    sh = bench.Shapes()
    assert sh.tp_inter * 8 == sh.inter
    routing = {"topk_ids": torch.tensor([[0, 3, -1, -1], [3, 5, -1, 0]])}
    weights = {"w_gate": torch.empty(16, 3072, 6144, device="meta")}
    assert bench.moe_bytes(routing, weights) == 3 * 3 * 3072 * 6144 * 2 + 2 * 2 * 6144 * 2


def test_tiny_checks_end_to_end(bench, triton_interpreter, tmp_path):
    out = tmp_path / "k.json"
    rc = bench.main(["--tiny", "--skip-timing", "--formats", "nvfp4", "--json", str(out)])
    assert rc == 0
    assert '"ok": true' in out.read_text()
