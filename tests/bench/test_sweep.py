"""The sweep: argument parsing, aggregation and the regression gate, and end to end on CPU."""

import json

import pytest
from typer.testing import CliRunner

from m3bench.bench.records import SpecCounters
from m3bench.bench.sweep import aggregate, compare, load_results, parse_spec_counters
from m3bench.cli.errors import M3BenchError
from m3bench.cli.main import app
from m3bench.cli.sweep import length_pairs, parse_int_list
from m3bench.runtime.errors import InputError


def test_parse_lists_and_ranges():
    assert parse_int_list("1,4,16,40,64", "c") == (1, 4, 16, 40, 64)
    assert parse_int_list("1..64", "c") == (1, 2, 4, 8, 16, 32, 64)
    assert parse_int_list("3..20", "c") == (3, 6, 12, 20)
    for bad in ("0,1", "a", "8..2", ""):
        with pytest.raises(M3BenchError):
            parse_int_list(bad, "c")
    assert length_pairs("1024,8192", "256") == ((1024, 256), (8192, 256))
    assert length_pairs("1024,8192", "1024,256") == ((1024, 1024), (8192, 256))
    with pytest.raises(M3BenchError):
        length_pairs("1,2", "1,2,3")


def _row(tp, c, tput, x90, **extra):
    return {"tp": tp, "concurrency": c, "isl": 8, "osl": 4, "total_tok_per_s_per_gpu": tput,
            "interactivity_x90": x90, **extra}


def test_aggregate_medians_and_spread():
    runs = [_row(1, 4, 100.0, 10.0, repeat=0), _row(1, 4, 110.0, 12.0, repeat=1), _row(1, 4, 90.0, 11.0, repeat=2)]
    (agg,) = aggregate(runs)
    assert agg["total_tok_per_s_per_gpu"] == 100.0 and agg["interactivity_x90"] == 11.0 and agg["repeats"] == 3
    assert agg["total_tok_per_s_per_gpu_spread_pct"] == pytest.approx(20.0)
    assert agg["interactivity_x90_spread_pct"] == pytest.approx(200 / 11)


def test_gate_needs_drop_beyond_threshold_and_spread():
    base = [_row(1, 1, 100.0, 50.0), _row(1, 4, 200.0, 20.0, total_tok_per_s_per_gpu_spread_pct=8.0)]
    cur = [_row(1, 1, 93.0, 49.0), _row(1, 4, 186.0, 20.0), _row(1, 16, 1.0, 1.0)]  # C16 not in the baseline
    changes = {(c.key[1], c.metric): c for c in compare(cur, base, max_regression_pct=5.0)}
    assert len(changes) == 4
    assert changes[(1, "total_tok_per_s_per_gpu")].regression  # -7% > 5% and > spread 0
    assert changes[(1, "total_tok_per_s_per_gpu")].change_pct == pytest.approx(-7.0)
    assert not changes[(1, "interactivity_x90")].regression  # -2%
    assert not changes[(4, "total_tok_per_s_per_gpu")].regression  # -7% but the baseline's spread is 8%
    assert not any(c.regression for c in compare(cur, base, max_regression_pct=None))


def test_load_results_errors(tmp_path):
    with pytest.raises(InputError):
        load_results(tmp_path / "none.json")
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(InputError):
        load_results(tmp_path)


def test_parse_spec_counters_both_prefixes():
    text = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10.0
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 30.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 5.0
"""
    assert parse_spec_counters(text) == SpecCounters(10, 30, 15, (8, 5, 2))
    assert parse_spec_counters(text.replace("vllm:", "m3bench:")) == SpecCounters(10, 30, 15, (8, 5, 2))
    assert parse_spec_counters("m3bench:num_requests_running 0\n") is None


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=1)


def _sweep_args(ckpt, out, *extra):
    return ["sweep", "--model", str(ckpt), "--load-format", "dummy", "--concurrency", "1,4", "--isl", "16",
            "--osl", "4", "--num-prompts", "4", "--warmup", "1", "--num-kv-blocks", "16", "--out", str(out), *extra]


def test_sweep_end_to_end_resume_and_gate(tiny_ckpt, tmp_path):
    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(app, _sweep_args(tiny_ckpt, out, "--junit", str(tmp_path / "a.xml")))
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    assert [(p["tp"], p["concurrency"]) for p in doc["points"]] == [(1, 1), (1, 4)]
    for p in doc["points"]:
        assert p["num_completed"] == 4 and p["num_failed"] == 0 and p["total_output_tokens"] == 16
        assert p["num_wrong_output_len"] == 0
        assert p["interactivity_x90"] > 0 and p["total_tok_per_s_per_gpu"] > 0 and p["client_floor_itl_ms"] > 0
        assert p["engine_steps"] >= 4 and 0 < p["host_ms_per_step_median"] <= p["host_ms_per_step_p90"]
        assert 0 <= p["device_idle_share"] < 1  # the engine's own step timing (in-process)
    assert "host ms/step" in res.output and "device idle" in res.output
    assert doc["frontier"] and (out / "results.csv").read_text().count("\n") == 3
    assert (out / "pareto.png").stat().st_size > 5000
    records = (out / "points" / "tp1_c4_isl16_osl4_r0.records.jsonl").read_text().splitlines()
    assert len(records) == 4 and all(len(json.loads(r)["chunk_times_s"]) == 4 for r in records)
    stamp = (out / "points" / "tp1_c1_isl16_osl4_r0.json").stat().st_mtime_ns

    # the same command again resumes: nothing reruns
    assert runner.invoke(app, _sweep_args(tiny_ckpt, out)).exit_code == 0
    assert (out / "points" / "tp1_c1_isl16_osl4_r0.json").stat().st_mtime_ns == stamp

    # a baseline twice as fast: the gate fails with exit 1 and a JUnit failure
    fast = dict(doc, points=[dict(p, total_tok_per_s_per_gpu=2 * p["total_tok_per_s_per_gpu"]) for p in doc["points"]])
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    res = runner.invoke(app, _sweep_args(tiny_ckpt, out, "--baseline", str(tmp_path / "fast.json"),
                                         "--max-regression", "5", "--junit", str(tmp_path / "b.xml")))
    assert res.exit_code == 1, res.output
    assert 'failures="2"' in (tmp_path / "b.xml").read_text()
    assert 'failures="0"' in (tmp_path / "a.xml").read_text()


def test_sweep_input_errors(tiny_ckpt, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, _sweep_args(tiny_ckpt, tmp_path / "x", "--tp", "0"))
    assert res.exit_code == 2 and "--tp" in res.output
    res = runner.invoke(app, _sweep_args(tiny_ckpt, tmp_path / "x", "--max-regression", "5"))
    assert res.exit_code == 2 and "--baseline" in res.output
    res = runner.invoke(app, _sweep_args(tiny_ckpt, tmp_path / "x", "--concurrency", "0"))
    assert res.exit_code == 2


def test_sweep_over_http_with_m3bench_serve(tiny_ckpt, tmp_path):
    """`--serve` starts `m3bench serve` (a child process, loopback, API key) and measures over HTTP."""
    res = CliRunner().invoke(app, _sweep_args(tiny_ckpt, tmp_path / "http", "--serve", "--concurrency", "2",
                                              "--api-key", "k3y"))
    assert res.exit_code == 0, res.output
    (p,) = json.loads((tmp_path / "http" / "results.json").read_text())["points"]
    assert p["num_completed"] == 4 and p["total_output_tokens"] == 16 and p["total_prompt_tokens"] >= 4 * 13
    chunks = [json.loads(r) for r in (tmp_path / "http" / "points" / "tp1_c2_isl16_osl4_r0.records.jsonl").read_text().splitlines()]
    assert all(sum(r["chunk_tokens"]) == 4 for r in chunks)  # token counts per chunk from return_token_ids
