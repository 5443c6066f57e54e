"""Faults in a sweep's records: a truncated points/*.json is measured again; results are strict JSON;
a bad --baseline is refused before any point runs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from m3bench.cli.main import app


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_truncated_point_is_measured_again(tiny_ckpt, tmp_path, capsys):
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.bench.sweep import SweepConfig, run_sweep, write_results

    cfg = SweepConfig(out_dir=tmp_path, engine=EngineConfig(tiny_ckpt, num_kv_blocks=16, async_scheduling=False),
                      concurrencies=(1,), lengths=((8, 2),), num_prompts=1, warmup=0)
    first = run_sweep(cfg)
    point = next((tmp_path / "points").glob("*.json"))
    text = point.read_text()
    point.write_text(text[: len(text) // 2])  # a crash mid-write without the atomic rename
    capsys.readouterr()
    again = run_sweep(cfg)
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and "measuring tp1_c1_isl8_osl2_r0 again" in err
    assert _strict(point.read_text())["name"] == "tp1_c1_isl8_osl2_r0"
    assert [r["num_requests"] for r in again] == [r["num_requests"] for r in first] == [1]
    row = {**again[0], "itl_ms_p99": float("nan")}  # a figure that is not finite is written as null + reason
    path, _ = write_results(tmp_path, [row], [row], [], {"request_rate": float("inf")})
    doc = _strict(path.read_text())
    assert doc["points"][0]["itl_ms_p99"] is None and "itl_ms_p99_null_reason" in doc["points"][0]
    assert doc["config"]["request_rate"] is None


def test_bad_baseline_refused_before_any_point(tiny_ckpt, tmp_path):
    (tmp_path / "base.json").write_text('{"points": [{"tp": 1, "con')
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["sweep", "--model", str(tiny_ckpt), "--out", str(out), "--concurrency", "1",
                                   "--isl", "8", "--osl", "2", "--num-prompts", "1", "--warmup", "0",
                                   "--baseline", str(tmp_path / "base.json"), "--max-regression", "5"])
    assert res.exit_code == 2 and "not a sweep results.json" in res.output and "Traceback" not in res.output
    assert not (out / "points").exists()
