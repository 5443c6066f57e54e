"""`m3bench gate PLAN.yaml`: plan validation, one verdict from real checks on the tiny checkpoint (table,
JUnit, Markdown, $GITHUB_STEP_SUMMARY), worst exit code 3 > 2 > 1 > 0."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from m3bench.evals.gate_plan import CheckCommand, load_plan, option_words
from m3bench.evals.gate_run import CheckResult, worst_exit
from m3bench.runtime.errors import InputError
from shared_data import SHARED_DATA as SHARED

GSM_0 = ("    protocol: gsm8k\n    protocol_version: lm-eval-gsm8k-3.0/m3bench-1\n    num_fewshot: 0\n"
         "    chat: false\n    max_tokens: 4\n")


def _write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def test_option_words_and_plan_loading(tmp_path):
    assert option_words("no_reference", True) == ["--no-reference"]
    assert option_words("progress", False, frozenset({"--no-progress"})) == ["--no-progress"]
    assert option_words("no_reference", False, frozenset({"--no-progress"})) == []  # no --no- form: left out
    assert option_words("task", ["mmlu", "gsm8k"]) == ["--task", "mmlu,gsm8k"]
    assert option_words("limit", 8) == ["--limit", "8"] and option_words("x", None) == []
    plan = load_plan(_write(tmp_path / "p.yaml", {"checks": [
        {"name": "a", "command": "accuracy", "args": {"task": "mmlu", "limit": 5}},
        {"name": "b", "command": "sweep", "args": ["--tp", "1"], "timeout_s": 60}]}))
    assert plan.name == "p" and [c.command for c in plan.checks] == [CheckCommand.ACCURACY, CheckCommand.SWEEP]
    assert plan.checks[0].args == ("--task", "mmlu", "--limit", "5") and plan.checks[1].timeout_s == 60


def test_false_flags_follow_the_commands_option_table(tmp_path):
    """`flag: false` is the command's --no- form where it has one (the app's own table), else left out: a plan
    saying `no_reference: false` or `sequential: false` once ran `--no-no-reference` and failed as bad input."""
    from m3bench.cli.gate import negatable_flags
    from m3bench.cli.main import app
    from typer.main import get_command

    table = negatable_flags(get_command(app))
    assert {"--no-progress", "--no-prefix-caching"} <= table[CheckCommand.ACCURACY]
    assert "--no-sequential" not in table[CheckCommand.ACCURACY] and "--no-serve" not in table[CheckCommand.SWEEP]
    plan = load_plan(_write(tmp_path / "p.yaml", {"checks": [
        {"name": "a", "command": "accuracy", "args": {"no_reference": False, "sequential": False, "progress": False,
                                                      "prefix_caching": False, "task": "mmlu"}},
        {"name": "b", "command": "sweep", "args": {"serve": False, "tp": 1}}]}), table)
    assert plan.checks[0].args == ("--no-progress", "--no-prefix-caching", "--task", "mmlu")
    assert plan.checks[1].args == ("--tp", "1")


@pytest.mark.parametrize("doc, message", [
    ("checks: [unclosed", "malformed YAML"),
    ({"checks": []}, "non-empty list of checks"),
    ({"checks": [{"name": "a", "command": "serve"}]}, "command must be one of accuracy, accept, sweep"),
    ({"checks": [{"name": "a", "command": "accept"}, {"name": "a", "command": "accept"}]}, "unique"),
    ({"checks": [{"name": "a", "command": "accept", "args": 3}]}, "args must be"),
    ({"checks": [{"name": "a", "command": "accept", "retries": 3}]}, "unknown keys"),
    ({"checks": [{"name": "a", "command": "accept", "timeout_s": -1}]}, "timeout_s"),
])
def test_bad_plans(tmp_path, doc, message):
    with pytest.raises(InputError, match=message):
        load_plan(_write(tmp_path / "bad.yaml", doc))


def test_worst_exit_orders_errors_above_regressions():
    def r(code):
        return CheckResult("c", "accuracy", code, "", Path("x.log"), 0.0)

    assert worst_exit([r(0), r(0)]) == 0 and worst_exit([r(0), r(1)]) == 1
    assert worst_exit([r(1), r(2), r(0)]) == 2 and worst_exit([r(3), r(1), r(2)]) == 3


def _gate(plan: Path, tmp: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "m3bench", "gate", str(plan), "--log-dir", str(tmp / "logs"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_cli_bad_plan_exits_2(tmp_path):
    done = _gate(_write(tmp_path / "bad.yaml", {"checks": [{"name": "a"}]}), tmp_path)
    assert done.returncode == 2 and "command must be one of" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(), reason="no shared data copy")
def test_an_injected_failing_check_fails_the_gate(tmp_path, monkeypatch):
    import os

    from m3bench.runtime.tiny import write_tiny_checkpoint

    tiny = write_tiny_checkpoint(tmp_path / "tiny-m3")
    ref = _write(tmp_path / "ref.yaml", "m3bench/tiny-m3:\n  - accuracy: 100.0\n    threshold: 100.0\n" + GSM_0)
    common = {"model": str(tiny), "model_id": "m3bench/tiny-m3", "task": "gsm8k", "num_fewshot": 0, "limit": 2,
              "max_tokens": 4, "device": "cpu", "dtype": "float32", "out": str(tmp_path / "out")}
    plan = _write(tmp_path / "plan.yaml", {"name": "ci", "checks": [
        {"name": "ungated", "command": "accuracy", "args": {**common, "no_reference": True}},
        {"name": "injected-regression", "command": "accuracy", "args": {**common, "reference": str(ref)}}]})
    summary = tmp_path / "step-summary.md"
    env = {**os.environ, "M3BENCH_DATA": str(SHARED), "OMP_NUM_THREADS": "1", "GITHUB_STEP_SUMMARY": str(summary),
           "HF_HUB_OFFLINE": "1"}
    done = _gate(plan, tmp_path, "--junit", str(tmp_path / "gate.xml"), "--markdown", str(tmp_path / "gate.md"), env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "gate ci: REGRESSION (exit 1)" in done.stderr
    cases = ET.parse(tmp_path / "gate.xml").getroot().findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["ungated", "injected-regression"]
    assert cases[0].find("failure") is None and cases[1].find("failure").get("type") == "Regression"
    md = (tmp_path / "gate.md").read_text()
    assert md == summary.read_text() and "| injected-regression | `accuracy` | regression | 1 | gsm8k 0.00 (n=2): fail |" in md
    assert (tmp_path / "logs" / "injected-regression.log").read_text().startswith("$ ")

    worse = _write(tmp_path / "worse.yaml", {"checks": [
        {"name": "bad-input", "command": "accuracy", "args": {"task": "nonsense", "model": "x", "backend": "openai",
                                                            "base_url": "http://127.0.0.1:9"}},
        {"name": "too-slow", "command": "accuracy", "args": {**common, "no_reference": True}, "timeout_s": 0.5}]})
    done = _gate(worse, tmp_path, env=env)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "bad input" in done.stderr and "internal error" in done.stderr


def test_the_documented_example_plan_is_the_shipped_one_and_loads():
    import re

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "gate.md").read_text()
    block = re.search(r"```yaml\n(# examples/gate.yaml\n.*?)```", doc, re.S).group(1)
    assert block == (root / "examples" / "gate.yaml").read_text()
    plan = load_plan(root / "examples" / "gate.yaml")
    assert {c.command for c in plan.checks} == set(CheckCommand)
    assert "--sequential" in plan.checks[3].args and "--baseline" in plan.checks[2].args


def test_an_accuracy_check_line_says_when_its_gate_could_not_fail(tmp_path):
    from m3bench.evals.gate_run import _accuracy_line

    path = tmp_path / "gsm8k-x.summary.json"
    path.write_text(json.dumps({"task": "gsm8k", "score": 0.0, "n": 1, "verdict": "pass", "gate_can_fail": False}))
    assert _accuracy_line(path) == "gsm8k 0.00 (n=1): pass (no score could fail at this n)"
    path.write_text(json.dumps({"task": "gsm8k", "score": 0.0, "n": 200, "verdict": "fail", "gate_can_fail": True}))
    assert _accuracy_line(path) == "gsm8k 0.00 (n=200): fail"
