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


def test_removed_records_then_replays_without_calling(dm, monkeypatch):
    """--mode removed: the eager pass calls the kind and keeps copies of its results; the passes after return them in
    call order without a call (another kind still runs); the shared expert's pair removes both roles; restored after."""
    calls = []

    def fake(x, w, bias=None, tiles=None, add=None, gate=None):
        calls.append(tuple(w.shape))
        return torch.full((x.shape[0], w.shape[0]), float(len(calls)))

    for mod in (dm.linear, dm.mlp):
        monkeypatch.setattr(mod, "skinny_linear", fake)
    x = torch.randn(1, 6144, dtype=torch.bfloat16)
    gu, down = torch.empty(768, 6144, dtype=torch.bfloat16), torch.empty(6144, 384, dtype=torch.bfloat16)
    o = torch.empty(6144, 1024, dtype=torch.bfloat16)
    counter, cache = [0], dm.Replay()
    with dm.removed(dm.SHARED, counter, cache):
        first = [dm.mlp.skinny_linear(x, gu, gate=object()), dm.linear.skinny_linear(x, o),
                 dm.linear.skinny_linear(x, down)]
        assert calls == [(768, 6144), (6144, 1024), (6144, 384)] and counter == [2]
        cache.recording, counter[0] = False, 0
        for _ in range(2):
            cache.restart()
            again = [dm.mlp.skinny_linear(x, gu, gate=object()), dm.linear.skinny_linear(x, o),
                     dm.linear.skinny_linear(x, down)]
            assert torch.equal(again[0], first[0]) and torch.equal(again[2], first[2])
            assert not torch.equal(again[1], first[1])  # o_proj is not removed: it ran again
    assert calls == [(768, 6144), (6144, 1024), (6144, 384), (6144, 1024), (6144, 1024)] and counter == [4]
    assert dm.linear.skinny_linear is fake and dm.mlp.skinny_linear is fake


def test_removed_copies_results_and_still_joins(dm, monkeypatch):
    """A removed site's tuple / dataclass results are copies (a later write to the original does not reach them), and
    an `add` callable (the side lane's join) is called on every replayed call."""
    from m3bench.runtime.kernels.moe_align import MoeAlignment

    made = []

    def fake_moe(x, *a, add=None, **kw):
        made.append((x + 1, MoeAlignment(x.clone(), x.clone(), x[:1].clone())))
        return made[-1]

    monkeypatch.setattr(dm.moe, "fused_moe", fake_moe)
    joins = []
    counter, cache = [0], dm.Replay()
    x = torch.randn(4)
    with dm.removed("routed experts", counter, cache):
        y, al = dm.moe.fused_moe(x, add=lambda: joins.append(1))
        made[0][0].zero_(), made[0][1].sorted_ids.zero_()
        assert torch.equal(y, x + 1) and torch.equal(al.sorted_ids, x)
        cache.recording = False
        cache.restart()
        assert dm.moe.fused_moe(x, add=lambda: joins.append(2))[0] is y
    assert joins == [2] and len(made) == 1 and counter == [2]


def test_in_place_kinds_are_not_removed(dm):
    assert set(dm.kinds("removed")) == ({*dm.SITES, *dm.GEMMS, dm.SHARED} - set(dm.IN_PLACE))
    assert dm.kinds("doubled") == (*dm.SITES, *dm.GEMMS)
    with pytest.raises(ValueError, match="in place"), dm.removed("add + norm", [0], dm.Replay()):
        pass
