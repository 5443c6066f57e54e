"""`m3bench accept` end to end on the tiny M3 + tiny Eagle3 pair (CPU): figures, resume, gate exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app

runner = CliRunner()
MODEL_ID = "m3bench/tiny-m3"
SMOKE_MODEL_ID = "m3bench/tiny-m3-skill"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    res = runner.invoke(app, ["checkpoint", "tiny", str(root / "m3"), "--draft", str(root / "eagle3")])
    assert res.exit_code == 0, res.output
    assert (root / "eagle3" / "config.json").is_file() and (root / "eagle3" / "model.safetensors").is_file()
    return root / "m3", root / "eagle3"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    (root / "gsm8k").mkdir()
    rows = [{"question": f"Ann has {i} pens and gets {i + 2} more. How many pens?", "answer": f"{i}+{i + 2}\n#### {2 * i + 2}"}
            for i in range(5)]
    (root / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _accept(pair, data_dir, out: Path, *extra: str):
    model, draft = pair
    args = ["accept", "--model", str(model), "--draft", str(draft), "--limit", "3", "--max-tokens", "12",
            "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu", "--model-id", MODEL_ID,
            "--no-progress", *extra]
    return runner.invoke(app, args)


def _summary(res) -> dict:
    start = res.stdout.index("{")
    return json.loads(res.stdout[start:res.stdout.rindex("}") + 1])


def _reference(tmp_path: Path, min_al: float) -> Path:
    path = tmp_path / f"ref-{min_al}.yaml"
    path.write_text(f"{MODEL_ID}:\n  - spec_dec_algo: Eagle3\n    protocol: gsm8k-chat\n    draft_len: 3\n"
                    f"    ref_al: {min_al + 0.1}\n    min_al: {min_al}\n")
    return path


def test_accept_end_to_end_and_resume(pair, data_dir, tmp_path):
    res = _accept(pair, data_dir, tmp_path, "--no-reference", "--junit", str(tmp_path / "a.xml"))
    assert res.exit_code == 0, res.output
    s = _summary(res)
    assert s["n"] == 3 and s["verdict"] == "no_reference" and not s["synthetic"]
    assert s["drafts"] > 0 and s["proposed"] == 3 * s["drafts"]
    assert s["acceptance_length"] == pytest.approx(1 + s["accepted"] / s["drafts"])
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["proposed"])
    assert sum(s["histogram"]) == s["drafts"] and len(s["per_position_rate"]) == 3
    prov = s["metadata"]["provenance"]  # versions, device, engine, data, seeds, both weights fingerprints
    assert prov["software"]["torch"] and prov["device"]["cuda"] is None and prov["engine"]["draft_len"] == 3
    assert prov["weights"]["target"]["kind"] == "files" and len(prov["weights"]["draft"]["sha256"]) == 64
    items = Path(s["items_path"]).read_text().splitlines()
    assert len(items) == 3 and all(json.loads(line)["steps"] for line in items)
    assert "acceptance_length" in (tmp_path / "a.xml").read_text()
    again = _accept(pair, data_dir, tmp_path, "--no-reference")  # same key: resumed, nothing recomputed
    assert again.exit_code == 0 and Path(s["items_path"]).read_text().splitlines() == items
    assert _summary(again)["acceptance_length"] == s["acceptance_length"]


def test_gate_exit_codes(pair, data_dir, tmp_path):
    """Synthetic AL 2.5 (draft_len 3): a min_al below passes (0), above fails (1)."""
    forced = ("--synthetic-acceptance", "2.5", "--draft-kv", "shared")
    low = _accept(pair, data_dir, tmp_path, *forced, "--reference", str(_reference(tmp_path, 1.5)))
    assert low.exit_code == 0, low.output
    s = _summary(low)
    assert s["verdict"] == "pass" and s["synthetic"] and 2.0 < s["acceptance_length"] < 3.0
    high = _accept(pair, data_dir, tmp_path, *forced, "--reference", str(_reference(tmp_path, 3.5)))
    assert high.exit_code == 1 and _summary(high)["verdict"] == "fail"


def test_bad_input_is_exit_two(pair, data_dir, tmp_path):
    missing = tmp_path / "other.yaml"
    missing.write_text("someone/else:\n  - spec_dec_algo: Eagle3\n    protocol: gsm8k-chat\n    draft_len: 3\n"
                       "    ref_al: 3.0\n    min_al: 2.8\n")
    res = _accept(pair, data_dir, tmp_path, "--reference", str(missing))
    assert res.exit_code == 2 and "no reference" in res.output
    model, _ = pair
    res = runner.invoke(app, ["accept", "--model", str(model), "--draft", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(app, ["accept", "--model", str(model)])
    assert res.exit_code == 2 and "--model needs --draft" in res.output
    res = runner.invoke(app, ["accept", "--draft", str(pair[1])])
    assert res.exit_code == 2 and "--draft needs --model" in res.output


def test_smoke_run_passes_its_golden_reference(tmp_path, monkeypatch):
    """No arguments: the shipped trained tiny checkpoint with its distilled draft on held-out chat-GSM8K questions
    of its synthetic task set, gated by the golden m3bench/tiny-m3-skill entry of acceptance_length.yaml."""
    from m3bench.cli.accept import SMOKE_LIMIT
    from m3bench.evals.references import AcceptanceProtocol, RunSpec, find_acceptance_reference

    monkeypatch.setenv("M3BENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("M3BENCH_DATA", str(tmp_path / "elsewhere"))  # not read: the smoke run brings its data
    res = runner.invoke(app, ["accept", "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    s = _summary(res)
    golden = find_acceptance_reference(SMOKE_MODEL_ID, RunSpec(spec_dec_algo="Eagle3"), AcceptanceProtocol("gsm8k-chat", 3))
    assert s["verdict"] == "pass" and s["n"] == SMOKE_LIMIT and s["metadata"]["model_id"] == SMOKE_MODEL_ID
    assert s["acceptance_length"] == pytest.approx(golden.ref_al, abs=0.05) and s["min_al"] == golden.min_al
    assert s["metadata"]["data"]["test"]["kind"] == "local"


def test_a_random_draft_fails_the_golden_gate(pair, tmp_path, monkeypatch):
    """The golden gate catches a draft that predicts nothing: a random draft beside the trained target exits 1."""
    from m3bench.cli.accuracy import smoke_data_dir
    from m3bench.runtime.tiny_skill import shipped_tiny_skill

    monkeypatch.setenv("M3BENCH_CACHE", str(tmp_path / "cache"))
    res = runner.invoke(app, ["accept", "--model", str(shipped_tiny_skill()), "--draft", str(pair[1]),
                              "--model-id", SMOKE_MODEL_ID, "--limit", "4", "--max-tokens", "48",
                              "--data-dir", str(smoke_data_dir()), "--device", "cpu", "--out", str(tmp_path),
                              "--no-progress"])
    assert res.exit_code == 1, res.output
    s = _summary(res)
    assert s["verdict"] == "fail" and s["acceptance_length"] < 1.1
