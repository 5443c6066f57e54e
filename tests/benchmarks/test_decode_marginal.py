"""benchmarks/decode_marginal.py on the CPU: the GEMM roles at one TP8 rank's shapes, and the doubling itself (each
call of the chosen kind runs twice, other kinds once, the module's function restored after). Its timings: the GPU."""

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def dm():
    return load_benchmark("decode_marginal")


def test_gemm_roles_at_the_rank_shapes(dm):
    x, x32 = torch.empty(1, 6144, dtype=torch.bfloat16), torch.empty(1, 6144)
    role = lambda n, k, gate=None, x=x, dt=torch.bfloat16: dm.gemm_role(x, torch.empty(n, k, dtype=dt), gate)  # noqa: E731
    assert role(1920, 6144) == role(1280, 6144) == "q|k|v(|index)"  # MSA layer (+ index q / k), dense layer
    assert role(6144, 1024) == "o_proj"
    assert role(128, 6144, x=x32, dt=torch.float32) == "router GEMV"
    assert role(768, 6144, gate=object()) == "shared gate|up" and role(6144, 384) == "shared down"
    assert role(3072, 6144, gate=object()) == role(6144, 1536) == "dense MLP"
    assert set(dm.GEMMS) == {"q|k|v(|index)", "o_proj", "router GEMV", "shared gate|up", "shared down", "dense MLP"}


def test_doubled_runs_the_chosen_kind_twice_and_restores(dm, monkeypatch):
    calls = []

    def fake(x, w, bias=None, tiles=None, add=None, gate=None):
        calls.append(tuple(w.shape))
        return x

    for mod in (dm.linear, dm.mlp):
        monkeypatch.setattr(mod, "skinny_linear", fake)
    x = torch.empty(1, 6144, dtype=torch.bfloat16)
    qkv, o = torch.empty(1920, 6144, dtype=torch.bfloat16), torch.empty(6144, 1024, dtype=torch.bfloat16)
    counter = [0]
    with dm.doubled("q|k|v(|index)", counter):
        dm.linear.skinny_linear(x, qkv)
        dm.linear.skinny_linear(x, o)
        dm.mlp.skinny_linear(x, qkv)
    assert calls == [(1920, 6144)] * 2 + [(6144, 1024)] + [(1920, 6144)] * 2 and counter == [2]
    assert dm.linear.skinny_linear is fake and dm.mlp.skinny_linear is fake
    calls.clear()
    monkeypatch.setattr(dm.norm, "add_rms_norm_fused", lambda *a, **k: calls.append("norm") or (a[0], a[1]))
    before = dm.norm.add_rms_norm_fused
    with dm.doubled("add + norm", counter := [0]):
        dm.norm.add_rms_norm_fused(x, x)
    assert calls == ["norm", "norm"] and counter == [1] and dm.norm.add_rms_norm_fused is before
