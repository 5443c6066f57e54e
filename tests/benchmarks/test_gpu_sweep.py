"""benchmarks/gpu_sweep.py: the configs it writes at per-GPU M3 shapes, the point counts, the budget guard,
and its CPU smoke run end to end (tiny shapes, both sweeps)."""

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def gs():
    sys.path.insert(0, str(BENCH))
    return importlib.import_module("gpu_sweep")


def test_configs_at_per_gpu_shapes(gs, tmp_path):
    from m3bench.runtime.config import AttnKind, ModelConfig
    from m3bench.runtime.speculative.config import EagleConfig

    st = gs.gpu_settings(gs.parse_args([]))
    target = gs.write_target(tmp_path / "t", st)
    cfg = ModelConfig.from_pretrained(target)
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == (6144, 8, 1, 128, 64)
    assert cfg.num_layers == 12 and cfg.vocab_size == 200064 // 8
    assert [k is AttnKind.DENSE for k in cfg.attn_kinds[:4]] == [True, True, True, False]
    assert (cfg.moe.num_experts, cfg.moe.top_k) == (16, 4)
    assert (cfg.msa.index_heads, cfg.msa.index_dim, cfg.msa.block_size, cfg.msa.topk_blocks) == (1, 128, 128, 16)
    assert (target / "tokenizer.json").is_file() and not list(target.glob("*.safetensors"))
    draft = EagleConfig.from_pretrained(gs.write_draft(tmp_path / "d", target, st))
    assert (draft.hidden_size, draft.num_heads, draft.num_kv_heads, draft.head_dim) == (6144, 8, 8, 128)
    assert draft.intermediate_size == 18432 // 8 and draft.vocab_size == draft.draft_vocab_size == 25008
    draft.check_target(cfg)


def test_counts_and_estimate(gs):
    assert [gs.counts(c) for c in (1, 4, 16, 64)] == [(1, 4), (4, 8), (16, 32), (64, 128)]
    est = gs.estimate_s(gs.gpu_settings(gs.parse_args([])))
    assert 0 < est["plain"] < est["eagle3"] and est["plain"] + est["eagle3"] < 7 * 60


def test_cpu_smoke_end_to_end(gs, tmp_path, capsys):
    results = gs.main(["--cpu-smoke", "--out", str(tmp_path)])
    for label in ("plain", "eagle3"):
        doc = json.loads((tmp_path / label / "results.json").read_text())
        assert [p["concurrency"] for p in doc["points"]] == [1, 2] and doc["frontier"]
        assert all("error" not in p and p["num_wrong_output_len"] == 0 for p in doc["points"])
        assert (tmp_path / label / "pareto.png").stat().st_size > 1000 and (tmp_path / label / "frontier.csv").is_file()
    for p in results["eagle3"]:
        assert p["synthetic"] is True and abs(p["spec_acceptance_length"] - 2.8) < 0.4
        assert p["num_requests"] == gs.counts(p["concurrency"])[1]
    assert all(p.get("spec_acceptance_length") is None for p in results["plain"])
    combined = json.loads((tmp_path / "combined.json").read_text())["rows"]
    assert len(combined) == 4 and all(r["status"] == "ok" for r in combined)
    assert "TPOT p50 ms" in capsys.readouterr().out


def test_budget_guard_skips_and_records(gs, tmp_path):
    results = gs.main(["--cpu-smoke", "--budget-s", "0", "--out", str(tmp_path)])
    for label in ("plain", "eagle3"):
        assert [r.get("skipped") for r in results[label]] == [True, True]
        doc = json.loads((tmp_path / label / "results.json").read_text())
        assert all("budget" in p["error"] for p in doc["points"]) and doc["frontier"] == []


def test_a_failing_sweep_is_recorded_and_the_other_still_reports(gs, tmp_path, monkeypatch):
    monkeypatch.setattr(gs, "write_draft", lambda dest, target, st: dest / "missing")  # the draft cannot load
    results = gs.main(["--cpu-smoke", "--out", str(tmp_path)])
    assert all("error" not in r for r in results["plain"]) and len(results["plain"]) == 2
    assert [r["concurrency"] for r in results["eagle3"]] == [1, 2]
    assert all("draft directory" in r["error"] for r in results["eagle3"])


def test_one_sweep_alone(gs, tmp_path):
    results = gs.main(["--cpu-smoke", "--budget-s", "0", "--sweeps", "plain", "--out", str(tmp_path)])
    assert list(results) == ["plain"] and not (tmp_path / "eagle3").exists()


def test_cpu_smoke_trace_replay(gs, tmp_path, capsys):
    """--trace: every point replays the trace's first requests (scaled), with the trace columns."""
    from shared_data import SHARED_DATA

    trace = SHARED_DATA / "traces" / "conversation_trace.jsonl"
    if not trace.is_file():
        pytest.skip(f"{trace} not present")
    results = gs.main(["--cpu-smoke", "--sweeps", "plain", "--trace", str(trace), "--max-requests", "4",
                       "--trace-scale", "0.015625", "--out", str(tmp_path)])
    rows = results["plain"]
    assert [r["concurrency"] for r in rows] == [1, 2] and all("error" not in r for r in rows)
    assert all(r["trace_requests"] == 4 and r["prefix_hit_rate_possible"] is not None for r in rows)
    assert "prefix" in capsys.readouterr().out
