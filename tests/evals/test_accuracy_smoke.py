"""`m3bench accuracy` with no arguments: the shipped trained tiny checkpoint on the held-out synthetic splits,
gated against its golden references, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from m3bench.cli.accuracy import SMOKE_MODEL_ID, SMOKE_TASKS
from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Settings
from m3bench.evals.references import RunSpec, find_accuracy_reference
from m3bench.runtime.tiny_skill import shipped_task_set

pytestmark = pytest.mark.slow  # one full smoke run: ~20 s of CPU on one thread


def test_smoke_run_matches_golden_references(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "M3BENCH_DATA"}  # the shipped task set, not a local copy
    env.update(M3BENCH_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "m3bench", "accuracy", "--out", str(tmp_path / "out"), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads(Path(p).read_text()) for p in done.stdout.split()]
    assert [s["task"] for s in summaries] == [t.task for t in SMOKE_TASKS]
    recorded = shipped_task_set().sha256
    for s, t in zip(summaries, SMOKE_TASKS):
        proto = get_protocol(Task(t.task))
        golden = find_accuracy_reference(proto.dataset.value, SMOKE_MODEL_ID, RunSpec(),
                                         proto.measured_with(Settings(t.num_fewshot, t.limit, t.max_tokens)))
        assert s["verdict"] == "pass" and s["n"] == golden.num_samples
        assert golden.threshold <= s["score"] <= golden.ceiling and s["ceiling"] == golden.ceiling  # the golden band
        assert s["metadata"]["data"]["test"]["kind"] == "local"
        assert s["metadata"]["data"]["test"]["location"].endswith(f"{proto.dataset.value}/test.jsonl")
        assert f"{proto.dataset.value}/test.jsonl" in recorded
    assert list((tmp_path / "cache" / "synthetic").glob("seed*/gsm8k/test.jsonl"))
