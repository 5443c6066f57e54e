"""Faults in the records of `m3bench accuracy`: a corrupt journal line, strict JSON, two writers on one --out."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from accuracy_cli import accuracy_cmd, accuracy_env
from shared_data import SHARED_DATA as SHARED
from typer.testing import CliRunner

from m3bench.cli.main import app
from m3bench.evals.results import ItemLog

needs_data = pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(), reason="no shared data copy")


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_corrupt_line_anywhere_is_reported_with_its_number_and_dropped(tmp_path, capsys):
    path = tmp_path / "x.items.jsonl"
    rows = [{"id": f"test/{i}", "run_key": "k", "value": 1.0} for i in range(4)]
    lines = [json.dumps(rows[0]), json.dumps(rows[1])[:-7], json.dumps(rows[2]), '["not", "a record"]',
             json.dumps({**rows[3], "run_key": "other"}), json.dumps(rows[3])[:10]]  # the last one cut by a kill
    path.write_text("\n".join(lines))
    done = ItemLog(path, "k").load()
    assert sorted(done) == ["test/0", "test/2"]  # test/1 (corrupt) and test/3 (cut) are computed again
    err = capsys.readouterr().err
    assert "2 corrupt line(s) (line 2, 4)" in err and str(path) in err
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["test/0", "test/2", "test/3"]
    assert ItemLog(path, "k").load() == done and capsys.readouterr().err == ""  # reported once, then clean


def test_strict_json_writes_null_and_a_reason():
    from m3bench.strict_json import dumps_strict

    doc = _strict(dumps_strict({"stderr": float("nan"), "n": 1, "x": [1.0, float("inf")], "deep": {"r": -float("inf")}}))
    assert doc["stderr"] is None and "n=1" in doc["stderr_null_reason"]
    assert doc["x"] == [1.0, None] and "x_null_reason" in doc
    assert doc["deep"] == {"r": None, "r_null_reason": "not a finite number: -Infinity"}


def _accuracy(tiny: Path, out: Path, tmp: Path, *extra: str):
    args = ["accuracy", "--model", str(tiny), "--model-id", "m3bench/tiny-m3", "--out", str(out), "--no-progress",
            "--device", "cpu", "--dtype", "float32", "--task", "gsm8k", "--num-fewshot", "0", "--max-tokens", "2",
            "--no-reference", *extra]
    env = {"M3BENCH_DATA": str(SHARED), "M3BENCH_CACHE": str(tmp / "cache"), "M3BENCH_LOG_DIR": str(tmp / "logs"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return CliRunner().invoke(app, args, env=env)


@needs_data
def test_corrupt_journal_rerun_recomputes_the_item_and_matches(tiny_ckpt, tmp_path):
    first = _accuracy(tiny_ckpt, tmp_path / "out", tmp_path, "--limit", "3")
    assert first.exit_code == 0, first.output[-2000:]
    summary_path = Path(first.stdout.strip().splitlines()[-1])
    clean = _strict(summary_path.read_text())
    items = next((tmp_path / "out").glob("gsm8k-*.items.jsonl"))
    lines = items.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2] + "#garbage"
    items.write_text("\n".join(lines) + "\n")
    again = _accuracy(tiny_ckpt, tmp_path / "out", tmp_path, "--limit", "3")
    assert again.exit_code == 0 and "corrupt line(s) (line 2)" in again.output, again.output[-2000:]
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 3
    resumed = _strict(summary_path.read_text())
    for key in ("score", "stderr", "n", "metrics", "run_key"):
        assert resumed[key] == clean[key], key


@needs_data
def test_single_item_summary_is_strict_json(tiny_ckpt, tmp_path):
    done = _accuracy(tiny_ckpt, tmp_path / "out", tmp_path, "--limit", "1")
    assert done.exit_code == 0, done.output[-2000:]
    summary = _strict(Path(done.stdout.strip().splitlines()[-1]).read_text())
    assert summary["n"] == 1 and summary["stderr"] is None and "n=1" in summary["stderr_null_reason"]


def test_second_writer_on_one_out_refuses(tiny_ckpt, tmp_path):
    from m3bench.cli.out_lock import out_lock

    with out_lock(tmp_path / "out", "test"):
        res = _accuracy(tiny_ckpt, tmp_path / "out", tmp_path, "--limit", "1")
    assert res.exit_code == 2 and "in use by another m3bench run (test, pid" in res.output
    assert not list((tmp_path / "out").glob("*.items.jsonl"))


@needs_data
@pytest.mark.slow
def test_two_accuracy_processes_on_one_out(tiny_ckpt, tmp_path):
    """The issue's case: two runs into one --out at once; the second refuses, the first writes each item once."""
    out = tmp_path / "out"
    args = ("--task", "mmlu", "--limit", "10", "--no-reference", "--max-batch-size", "4")
    first = subprocess.Popen(accuracy_cmd(tiny_ckpt, out, *args), env=accuracy_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = out / ".m3bench.lock"
        deadline = time.monotonic() + 120
        while not (lock.is_file() and lock.read_text()) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        if first.poll() is not None:
            pytest.skip("the first run ended before the second started")
        second = subprocess.run(accuracy_cmd(tiny_ckpt, out, *args), env=accuracy_env(tmp_path),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and "in use by another m3bench run (accuracy, pid" in second.stderr
        assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
        first.wait()
    ids = [json.loads(line)["id"] for line in next(out.glob("mmlu-*.items.jsonl")).read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 10
