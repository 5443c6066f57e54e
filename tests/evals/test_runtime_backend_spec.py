"""The runtime eval backend with an Eagle3 draft: lossless greedy outputs, per-request spec counters,
and `m3bench accuracy --draft` end to end on the tiny pair."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from m3bench.evals.backends.base import GenRequest
from m3bench.evals.backends.runtime import RuntimeBackend
from m3bench.runtime.engine_config import EngineConfig
from shared_data import SHARED_DATA as SHARED



@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft
    from m3bench.runtime.tiny import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("pair")
    target = write_tiny_checkpoint(root / "tiny-m3", seed=0)
    write_tiny_draft(root / "draft", target_dir=target, seed=1)
    return target, root / "draft"


def _generate(backend, requests):
    out = {}
    backend.generate(requests, lambda i, r: out.__setitem__(i, r))
    return [out[i] for i in range(len(requests))]


@pytest.mark.parametrize("draft_kv", ["separate", "shared"])
def test_draft_keeps_greedy_outputs_and_reports_counters(pair, draft_kv):
    target, draft = pair
    requests = [GenRequest(prompt="Question: what is two plus two?\nAnswer:", max_tokens=12, stop=("Question:",)),
                GenRequest(prompt="The trains left at", max_tokens=9)]
    plain = _generate(RuntimeBackend(EngineConfig(device="cpu", model=target, dtype="float32")), requests)
    spec_backend = RuntimeBackend(EngineConfig(device="cpu", model=target, dtype="float32", draft=draft, draft_len=3, draft_kv=draft_kv))
    spec = _generate(spec_backend, requests)
    assert [r.text for r in spec] == [r.text for r in plain]
    assert [r.num_output_tokens for r in spec] == [r.num_output_tokens for r in plain]
    for r in spec:
        s = r.spec
        assert s["drafts"] > 0 and 0 <= s["accepted"] <= s["proposed"] <= 3 * s["drafts"]
        assert s["acceptance_length"] == pytest.approx(1 + s["accepted"] / s["drafts"]) and s["synthetic"] is False
    assert all(r.spec == {} for r in plain)
    assert spec_backend.describe()["draft_kv"] == draft_kv


@pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(), reason="no shared data copy")
def test_accuracy_cli_with_draft(pair, tmp_path, monkeypatch):
    from m3bench.cli.main import app

    target, draft = pair
    monkeypatch.setenv("M3BENCH_DATA", str(SHARED))
    monkeypatch.setenv("M3BENCH_CACHE", str(tmp_path / "cache"))
    args = ["accuracy", "--model", str(target), "--model-id", "m3bench/tiny-m3", "--task", "gsm8k", "--num-fewshot",
            "0", "--limit", "2", "--max-tokens", "6", "--no-reference", "--no-progress", "--device", "cpu",
            "--dtype", "float32", "--draft", str(draft), "--draft-len", "2", "--draft-kv", "shared",
            "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for f in (tmp_path / "out").rglob("*.jsonl") for line in f.read_text().splitlines()
               if line.strip()]
    specs = [r["raw_output"]["spec"] for r in records]
    assert len(specs) == 2 and all(s["drafts"] > 0 and s["proposed"] <= 2 * s["drafts"] for s in specs)
