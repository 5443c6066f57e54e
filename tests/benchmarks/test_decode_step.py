"""benchmarks/decode_step.py (+ decode_floor.py): the bytes / floor arithmetic, the layer fit, the decode metadata,
and a CPU smoke run of the whole script (tiny shapes, torch paths)."""

import importlib.util
import json
import os

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def fl():
    return load_benchmark("decode_floor")


@pytest.fixture(scope="module")
def ds(fl):
    return load_benchmark("decode_step")


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


def test_floors_read_at_the_bandwidth_the_run_measured(fl, monkeypatch):
    """One bandwidth for every floor: the H200's 4.3 TB/s until a GPU run sets its own device's copy rate
    (floor_bandwidth.use_device_bandwidth); off the GPU the default stays and the line says so."""
    bw = load_benchmark("floor_bandwidth")
    monkeypatch.setitem(fl.BANDWIDTH, "bytes_per_s", fl.BANDWIDTH["bytes_per_s"])
    monkeypatch.setitem(fl.BANDWIDTH, "source", fl.BANDWIDTH["source"])
    f = fl.floor_of(fl.M3Shapes(), 5, 3, 8192)
    line = bw.use_device_bandwidth("cpu")
    assert line.startswith("floor bandwidth 4.30 TB/s") and "not measured" in line
    before = f.ms
    fl.set_peak_bytes_per_s(3.0e12, "a copy on an H100")
    assert f.ms == pytest.approx(before * 4.3 / 3.0) and bw.use_device_bandwidth("cpu").endswith("(a copy on an H100)")


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
    assert len(res["m3"]) == 8 and all(r["finite"] and r["step_ms"] > 0 for r in res["m3"])
    local = [r for r in res["m3"] if r["routing"] == "all-local"]
    real = [r for r in res["m3"] if r["routing"] == "realistic"]
    assert all(r["local_picks_per_token"] == 4.0 for r in local)
    assert all(r["local_picks_per_token"] < 4.0 for r in real)
    for a, b in zip(real, local):  # same shapes, fewer experts read: a lower floor
        assert (a["batch"], a["context"]) == (b["batch"], b["context"]) and a["floor_ms"] < b["floor_ms"]
    out = capsys.readouterr().out
    assert "vLLM anchor" in out and "140 us per layer" in out and "floor ms" in out


@pytest.fixture(scope="module")
def rt(fl):
    return importlib.import_module("decode_routing"), importlib.import_module("decode_setup")


def test_rank_floor_counts_the_local_experts_read(fl):
    r = fl.RANK
    assert (r.router_experts, r.full_kv_heads, r.world) == (128, 4, 8)
    assert fl.expected_local_experts(r, 1) == pytest.approx(16 * 4 / 128)  # half an expert at batch 1
    assert fl.expected_local_experts(fl.M3Shapes(), 16) == pytest.approx(fl.distinct_experts(16, 4, 16))
    moe = fl.layer_kinds(r, 60).count(True)
    one, four = fl.floor_of(r, 60, 1, 8192, [1.0] * moe), fl.floor_of(r, 60, 1, 8192, [4.0] * moe)
    assert four.weights_bytes - one.weights_bytes == pytest.approx(moe * 3 * fl.expert_bytes(r))
    per_layer_us = fl.floor_of(r, 60, 1, 8192).ms / 60 * 1e3
    assert 20 < per_layer_us < 35  # ~25 us per layer (docs/performance.md); all-local ~110
    assert 100 < four.ms / 60 * 1e3 < 130
    with pytest.raises(ValueError):
        fl.floor_of(r, 60, 1, 8192, [1.0] * 3)
    assert fl.layers_that_fit(r, 64, 8192, 120e9) == 60  # a bf16 rank fits whole up to 8k x 64


def test_rank_model_shapes_and_replicated_index_projection(fl, rt):
    _, setup = rt
    s = fl.TINY_RANK
    cfg = setup.our_config(setup.hf_m3_config(s, 2, 256))
    a = setup.rank_model(s, cfg, torch.float32, torch.device("cpu"), None)
    attn, moe = a.layers[1].attn, a.layers[1].mlp
    d = s.head_dim
    assert attn.qkv.local_sizes == (s.heads * d, d, d, 4 * s.index_dim, s.index_dim)  # all 4 index heads
    assert moe.router_weight.shape[0] == 8 * s.experts and moe.w_down.shape[0] == s.experts
    assert a.embed_tokens.shape[0] == s.vocab and attn.index_pick == slice(0, 1)


def test_replicated_index_projection_computes_the_same_rank(fl, rt):
    """Every index head computed, the rank's kept: same outputs as the split projection (ranks 0 and 5)."""
    from m3bench.runtime.attention.metadata import build_attn_metadata
    from m3bench.runtime.kv_cache import KVCache, KVDtype
    from m3bench.runtime.model import M3ForCausalLM

    _, setup = rt
    s = fl.TINY_RANK
    cfg = setup.our_config(setup.hf_m3_config(s, 2, 256))
    ids = torch.randint(0, s.vocab * 8, (70,), generator=torch.Generator().manual_seed(1))
    for rank in (0, 5):
        outs = []
        for replicate in (False, True):
            m = M3ForCausalLM(cfg, torch.float64, "cpu", tp=setup.SoloRank(rank, 8))
            if replicate:
                m.layers[1].attn.replicate_index_projection()
            m.init_dummy(3)
            kv = KVCache(cfg, 8, s.page, KVDtype.AUTO, torch.float64, "cpu", m.tp)
            meta = build_attn_metadata([70], [70], [list(range(5))], s.page)
            outs.append(m(ids, meta.positions, meta, kv))
        assert m.layers[1].attn.index_pick == slice(rank // 2, rank // 2 + 1)
        assert torch.allclose(outs[0], outs[1], rtol=1e-10, atol=1e-10)


def test_routing_modes_and_their_stats(fl, rt):
    routing, setup = rt
    s = fl.TINY_RANK
    cfg = setup.our_config(setup.hf_m3_config(s, 3, 256))
    m = setup.rank_model(s, cfg, torch.float32, torch.device("cpu"), None)
    meta = setup.decode_meta(s, 16, 20, torch.device("cpu"))
    from m3bench.runtime.kv_cache import KVCache, KVDtype

    kv = KVCache(cfg, 16 * 2 + 1, s.page, KVDtype.AUTO, torch.float32, "cpu", m.tp)
    ids = torch.randint(0, s.vocab, (16,), generator=torch.Generator().manual_seed(0))
    step = lambda: m(ids, meta.positions, meta, kv)  # noqa: E731
    drawn = m.layers[1].mlp.router_bias.clone()
    routing.set_routing(m, routing.Routing.ALL_LOCAL)
    worst = routing.routing_stats(m, step)
    assert worst.local_picks_per_token == 4.0 and len(worst.experts_read) == 2
    routing.set_routing(m, routing.Routing.REALISTIC)
    assert torch.equal(m.layers[1].mlp.router_bias, drawn)
    real = routing.routing_stats(m, step)
    assert 0.1 < real.local_picks_per_token < 1.5  # ~4 x 4/32 = 0.5 expected
    assert all(2 <= e <= s.experts for e in real.experts_read)  # tokens route apart (real embeddings)
    picks, distinct = routing.local_picks(torch.tensor([[0, 5, 3, 40], [3, 3, 9, 1]]), 0, 4)
    assert (picks, distinct) == (2.5, 3)


def test_cpu_smoke_profile_counts_ops_per_layer(ds, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert ds.main(["--cpu-smoke", "--profile"]) == 0
    res = json.loads((tmp_path / "decode_profile.json").read_text())
    assert {p["variant"] for p in res["profile"]} == {"fused"}  # the torch backend on CPU: one variant
    parts = {(p["part"], p["batch"]) for p in res["profile"]}
    names = ("dense layer", "MSA+MoE layer (realistic)", "MSA+MoE layer (all-local)", "head")
    assert parts == {(n, b) for n in names for b in (1, 2)}
    for p in res["profile"]:
        ops = {k["name"]: k["count"] for k in p["kernels"]}
        assert all(c > 0 for c in ops.values()) and all(k["us"] == 0 for k in p["kernels"])  # CPU: counts only
        if p["part"].startswith("MSA"):
            assert ops["aten::sigmoid"] >= 1 and ops["aten::topk"] >= 1  # the router is in the layer
        if p["part"] == "head":
            assert ops["aten::linear"] == 1  # the logits
    assert "torch ops (counts only: CPU) per call" in capsys.readouterr().out


def test_ops_sets_compare_before_and_after(ds):
    def row(b, rt, ops, ms):
        return {"batch": b, "context": 8192, "routing": rt, "ops": ops, "step_ms": ms, "achieved_over_floor": 1 / ms}
    rows = [row(1, "realistic", "fused-v1", 6.0), row(1, "realistic", "fused", 4.0),
            row(64, "realistic", "fused-v1", 30.0), {"batch": 64, "context": 8192, "routing": "realistic",
                                                     "ops": "fused", "error": "OOM"}]
    lines = ds.ops_comparison(rows, 60)
    assert len(lines) == 2 and "fused-v1 ms" in lines[0]  # B=64 lacks its after row: left out
    assert lines[1].split()[:5] == ["1", "8192", "realistic", "6.000", "4.000"] and lines[1].endswith("1.50x")
    assert ds.ops_comparison(rows[:1], 60) == []
    plan = ds.make_plan(ds.parse_args(["--quick", "--ops-sets", "unfused", "fused"]), True)
    assert plan.ops_sets == ("unfused", "fused")
    assert ds.make_plan(ds.parse_args(["--quick", "--unfused"]), True).ops_sets == ("unfused",)


def test_checks_pass_only_with_every_row_ok(ds, monkeypatch):
    # run_checks' verdict: every check row present and ok, and the engine check ok. A check that raised
    # leaves its rows out (the verdict fails); a row over its tolerance fails it.
    from decode_checks import COMPONENT_CHECKS

    row = {"what": "x", "rel_err": 0.0, "tol": 1.0, "ok": True}
    plan = ds.make_plan(ds.parse_args(["--cpu-smoke"]), False)
    parts = {"model": [row], "components": [dict(row) for _ in range(COMPONENT_CHECKS)], "engine": {"ok": True}}
    monkeypatch.setattr(ds, "check_fast_path", lambda *a: parts["model"])
    monkeypatch.setattr(ds, "check_components", lambda *a: parts["components"])
    monkeypatch.setattr(ds, "check_engine_graphs", lambda *a: parts["engine"])
    assert ds.run_checks(plan, torch.device("cpu"), True, {})
    parts["components"] = parts["components"][:-1]  # one row missing
    assert not ds.run_checks(plan, torch.device("cpu"), True, {})
    parts["components"] = [dict(row) for _ in range(COMPONENT_CHECKS - 1)] + [dict(row, ok=False)]
    assert not ds.run_checks(plan, torch.device("cpu"), True, {})


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter run (the GPU runs them in test_decode_step_gpu)")
def test_component_checks_return_their_rows_on_cpu(ds):
    import decode_checks

    os.environ.setdefault("TRITON_INTERPRET", "1")  # before a kernel module is first imported (decode_step does so)
    rows = decode_checks.check_components(ds.TINY_RANK, torch.device("cpu"), True)
    assert len(rows) == decode_checks.COMPONENT_CHECKS and all(r["ok"] for r in rows), rows


def test_the_runtime_ops_set_is_what_the_runtime_does_by_default(fl, rt):
    """OpsSet.runtime() (decode_step's and decode_marginal's default) switches nothing a freshly built rank model and
    the process do not already do: every layer switch, PDL mode and routed-expert split as built."""
    from m3bench.runtime.kernels import backend, moe

    _, setup = rt
    s = fl.TINY_RANK

    def switches(model) -> list:
        flags = [backend.PDL["launch"], moe.ROUTED_SPLIT_TOKENS, moe.ROUTED_SPLIT_DOWN, moe.ROUTED_GEMV_FMTS,
                 getattr(model.backend, "fuse_ops", None), getattr(model.backend, "select_in_attention", None)]
        for layer in model.layers:
            parts = (layer.attn, layer.mlp, getattr(layer.mlp, "shared", None))
            names = ("fuse_branches", "fuse_qkv_heads", "index_beside", "fuse_act", "fuse_router", "fuse_shared",
                     "fuse_align", "fuse_router_input", "shared_beside", "sum_in_norm", "route_in_experts")
            flags += [getattr(p, n, None) for p in parts for n in names]
            flags += [m.skinny_rows for m in layer.modules() if hasattr(m, "skinny_rows")]
        return flags

    from m3bench.runtime.attention.triton_backend import TritonBackend

    with setup.pdl_mode(backend.pdl_from_env()):
        model = setup.rank_model(s, setup.our_config(setup.hf_m3_config(s, 2, 256)), torch.float32,
                                 torch.device("cpu"), TritonBackend())
        built = switches(model)
        setup.set_ops(model, setup.OpsSet.runtime())
        assert switches(model) == built
        moes = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "route_in_experts")]
        assert model.backend.select_in_attention and moes and all(m.route_in_experts for m in moes)
        for ops in (setup.OpsSet.SKINNY_PDL_SIDE_WHOLE, setup.OpsSet.SPLIT, setup.OpsSet.DOWN2, setup.OpsSet.SELECT,
                    setup.OpsSet.ROUTE):  # routed experts unsplit, the down GEMM whole, a top-k in its own launch
            setup.set_ops(model, ops)
            assert switches(model) != built
            assert model.backend.select_in_attention == (ops is setup.OpsSet.SELECT)
            assert all(m.route_in_experts == (ops is setup.OpsSet.ROUTE) for m in moes)
        setup.set_ops(model, setup.OpsSet.runtime())
        assert switches(model) == built


def test_pdl_ops_sets_switch_the_process_and_are_restored(fl, rt):
    from m3bench.runtime.kernels import moe
    from m3bench.runtime.kernels.backend import PDL, Pdl

    _, setup = rt
    s = fl.TINY_RANK
    model = setup.rank_model(s, setup.our_config(setup.hf_m3_config(s, 2, 256)), torch.float32,
                             torch.device("cpu"), None)
    before = PDL["launch"]
    with setup.pdl_mode():
        for ops, mode in ((setup.OpsSet.SKINNY_PDL, Pdl.ON), (setup.OpsSet.SKINNY_PDL_EARLY, Pdl.EARLY),
                          (setup.OpsSet.SKINNY, Pdl.OFF), (setup.OpsSet.FUSED, Pdl.OFF)):
            setup.set_ops(model, ops)
            assert PDL["launch"] is mode and model.layers[0].attn.qkv.skinny_rows == (
                16 if ops.holds(setup.OpsSet.SKINNY) else 0)
        with setup.pdl_mode(Pdl.EARLY):
            assert PDL["launch"] is Pdl.EARLY
        assert PDL["launch"] is Pdl.OFF
        setup.set_ops(model, setup.OpsSet.SPLIT)
        assert moe.ROUTED_SPLIT_TOKENS == 1 and PDL["launch"] is Pdl.ON
        setup.set_ops(model, setup.OpsSet.SKINNY_PDL_SIDE_WHOLE)
        assert moe.ROUTED_SPLIT_TOKENS == 0
        setup.set_ops(model, setup.OpsSet.SPLIT)
        assert moe.ROUTED_SPLIT_TOKENS == 1 and moe.ROUTED_SPLIT_DOWN == 1
        setup.set_ops(model, setup.OpsSet.DOWN4)
        assert moe.ROUTED_SPLIT_TOKENS == 1 and moe.ROUTED_SPLIT_DOWN == 4
        setup.set_ops(model, setup.OpsSet.SUM_NORM)
        assert moe.ROUTED_SPLIT_TOKENS == 1 and moe.ROUTED_SPLIT_DOWN == 2
        moes = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "sum_in_norm")]
        assert moes and all(m.sum_in_norm for m in moes)
        assert moe.ROUTED_GEMV_FMTS == {1}  # the runtime's: MXFP8 experts as GEMVs at one token
        setup.set_ops(model, setup.OpsSet.GEMV)
        assert moe.ROUTED_GEMV_FMTS == {0, 1} and moe.ROUTED_SPLIT_DOWN == 2 and not any(m.sum_in_norm for m in moes)
        setup.set_ops(model, setup.OpsSet.DOWN2)
        assert moe.ROUTED_SPLIT_DOWN == 2 and not any(m.sum_in_norm for m in moes)
        assert moe.ROUTED_GEMV_FMTS == {1}
        attns = [layer.attn for layer in model.layers]
        setup.set_ops(model, setup.OpsSet.DOWN2_HEADS_INDEX)
        assert moe.ROUTED_SPLIT_DOWN == 2 and moe.ROUTED_GEMV_FMTS == {1}
        assert all(a.fuse_qkv_heads and a.index_beside for a in attns) and not any(m.sum_in_norm for m in moes)
        setup.set_ops(model, setup.OpsSet.EVERY)
        assert moe.ROUTED_SPLIT_TOKENS == 1 and moe.ROUTED_SPLIT_DOWN == 2 and moe.ROUTED_GEMV_FMTS == {0, 1}
        assert all(a.fuse_qkv_heads and a.index_beside for a in attns) and all(m.sum_in_norm for m in moes)
        setup.set_ops(model, setup.OpsSet.DOWN2)
        assert not any(a.fuse_qkv_heads or a.index_beside for a in attns) and not any(m.sum_in_norm for m in moes)
        setup.set_ops(model, setup.OpsSet.GEMV)  # plain GEMVs left on: the exit restores MXFP8 alone
        setup.set_ops(model, setup.OpsSet.SKINNY_PDL_SIDE_WHOLE)  # left unsplit: the exit restores the split
        assert moe.ROUTED_SPLIT_DOWN == 1 and moe.ROUTED_GEMV_FMTS == frozenset()  # as timed before the GEMVs
    assert PDL["launch"] is before and moe.ROUTED_SPLIT_TOKENS == 1  # the runtime's defaults, restored
    assert moe.ROUTED_SPLIT_DOWN == 2 and moe.ROUTED_GEMV_FMTS == {1}


def test_cpu_smoke_times_pdl_sets_and_checks_under_the_chosen_mode(ds, tmp_path, monkeypatch):
    from m3bench.runtime.kernels.backend import PDL

    monkeypatch.setenv("OUT", str(tmp_path))
    before = PDL["launch"]
    argv = ["--cpu-smoke", "--skip-baselines", "--skip-checks", "--pdl", "early", "--batches", "1", "--contexts", "20",
            "--ops-sets", "skinny", "skinny-pdl"]
    assert ds.main(argv) == 0 and PDL["launch"] is before
    res = json.loads((tmp_path / "decode_step.json").read_text())
    assert res["pdl"] == "early" and [r["ops"] for r in res["m3"]] == ["skinny", "skinny-pdl"] * 2
    assert ds.parse_args(["--pdl", "on"]).pdl == "on" and ds.parse_args([]).pdl is None


def test_cpu_smoke_realistic_rows_average_their_routing_draws(ds, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--cpu-smoke", "--skip-baselines", "--skip-checks", "--batches", "1", "--contexts", "20", "--draws", "3"]
    assert ds.main(argv) == 0
    rows = {r["routing"]: r for r in json.loads((tmp_path / "decode_step.json").read_text())["m3"]}
    real, local = rows["realistic"], rows["all-local"]
    assert "draws" not in local and len(real["draws"]) == 3
    mean = lambda key: sum(d[key] for d in real["draws"]) / 3  # noqa: E731
    assert real["step_ms"] == pytest.approx(mean("step_ms")) and real["floor_ms"] == pytest.approx(mean("floor_ms"))
    assert real["local_picks_per_token"] == pytest.approx(mean("local_picks_per_token"))
    assert real["achieved_over_floor"] == pytest.approx(real["floor_ms"] / real["step_ms"])
    assert "(mean of 3 draws)" in capsys.readouterr().out
    before = torch.randint(0, 1000, (4,), generator=torch.Generator().manual_seed(4 + 20))  # the tokens before draws
    assert torch.equal(ds.draw_ids(1000, 4, 20, 0), before)
    assert not torch.equal(ds.draw_ids(1000, 4, 20, 0), ds.draw_ids(1000, 4, 20, 1))
