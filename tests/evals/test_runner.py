"""Runner logic on a deterministic in-test backend: records, resume, run keys, gates, summaries."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from m3bench.evals.backends.base import GenResult, ScoreResult
from m3bench.evals.protocols import Task
from m3bench.evals.protocols.base import Settings
from m3bench.evals.references import RunSpec
from m3bench.evals.runner import RunPlan, run_task
from shared_data import SHARED_DATA as SHARED

pytestmark = pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy")


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


class HashBackend:
    """Test double: log-probs and answers are fixed functions of the request text."""

    name = "test-hash"

    def __init__(self, drop: int | None = None):
        self.seen: list[str] = []
        self.drop = drop

    def generate(self, requests, on_done):
        for i, r in enumerate(requests):
            self.seen.append(r.prompt)
            if i != self.drop:
                on_done(i, GenResult(f"The answer is\n#### {_h(r.prompt) % 7}", "stop", 10, 5))

    def score(self, requests, on_done):
        for i in reversed(range(len(requests))):  # out of order on purpose
            r = requests[i]
            self.seen.append(r.context + r.continuation)
            on_done(i, ScoreResult(-float(_h(r.context + r.continuation) % 1000), False))

    def apply_chat_template(self, messages, **kwargs):
        return "".join(m["content"] for m in messages)

    def tokenize(self, text):
        return list(text.encode())

    def describe(self):
        return {"model": "hash", "dtype": "none"}

    def close(self):
        pass


def plan(tmp_path: Path, task=Task.MMLU, limit=40, reference: Path | None = None, **settings) -> RunPlan:
    return RunPlan(task, Settings(limit=limit, **settings), "org/model", "/nowhere", None, RunSpec(), tmp_path / "out",
                   SHARED, reference, reference is not None)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_and_summary(tmp_path):
    summary, paths = run_task(plan(tmp_path), HashBackend(), progress=False)
    records = lines(paths.items)
    assert len(records) == 40 == summary["n"] and len({r["id"] for r in records}) == 40
    assert all(r["protocol_version"] == summary["protocol_version"] and len(r["prompt_sha256"]) == 64 for r in records)
    assert all(len(r["raw_output"]) == 4 for r in records)
    assert summary["score"] == pytest.approx(100 * sum(r["value"] for r in records) / 40)
    assert sum(c["n"] for c in summary["categories"].values()) == 40
    assert json.loads(paths.summary.read_text())["run_key"] == summary["run_key"]
    assert summary["metadata"]["data"]["test"]["sha256"] and summary["verdict"] == "no_reference"


def test_rerun_resumes_and_skips_finished_items(tmp_path):
    full, paths = run_task(plan(tmp_path, task=Task.GSM8K, num_fewshot=0), HashBackend(), progress=False)
    kept = paths.items.read_text().splitlines(keepends=True)[:15]
    paths.items.write_text("".join(kept) + '{"id": "test/9', encoding="utf-8")  # a line cut by a kill
    backend = HashBackend()
    resumed, _ = run_task(plan(tmp_path, task=Task.GSM8K, num_fewshot=0), backend, progress=False)
    assert len(backend.seen) == 40 - 15
    ids = [r["id"] for r in lines(paths.items)]
    assert len(ids) == len(set(ids)) == 40
    drop = ("metadata", "items_path")
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    again = HashBackend()
    run_task(plan(tmp_path, task=Task.GSM8K, num_fewshot=0), again, progress=False)
    assert again.seen == []


def test_changed_settings_change_the_run_key(tmp_path):
    a, _ = run_task(plan(tmp_path, limit=10), HashBackend(), progress=False)
    b, _ = run_task(plan(tmp_path, limit=10, num_fewshot=1), HashBackend(), progress=False)
    c, _ = run_task(replace(plan(tmp_path, limit=10), model_id="org/other"), HashBackend(), progress=False)
    assert len({a["run_key"], b["run_key"], c["run_key"]}) == 3


MMLU_0 = "    protocol: mmlu\n    protocol_version: lm-eval-mmlu-1.0/m3bench-1\n    num_fewshot: 0\n    chat: false\n"


def test_gate_verdicts(tmp_path):
    ref = tmp_path / "ref.yaml"
    ref.write_text("org/model:\n  - accuracy: 99.0\n" + MMLU_0)
    fail, _ = run_task(plan(tmp_path, reference=ref), HashBackend(), progress=False)
    assert fail["verdict"] == "fail" and fail["threshold"] == pytest.approx(99.0 - 1.6448536 * (2 * 2500 / 40) ** 0.5)
    ref.write_text("org/model:\n  - accuracy: 1.0\n    threshold: 0.01\n" + MMLU_0)
    ok, _ = run_task(plan(tmp_path, reference=ref), HashBackend(), progress=False)
    assert ok["verdict"] == "pass" and ok["threshold"] == 0.01 and ok["reference"]["accuracy"] == 1.0
    assert ok["gate_can_fail"] and ok["score"] > 0.01


def test_missing_backend_result_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="no result for 1"):
        run_task(plan(tmp_path, task=Task.GSM8K, num_fewshot=0, limit=5), HashBackend(drop=2), progress=False)
