"""Provenance: software versions, device, weights fingerprints (which key the runs), in accuracy summaries and
sweep results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import m3bench.provenance as prov
from m3bench.provenance import device_info, software, weights_fingerprint


@pytest.fixture()
def ckpt(tmp_path) -> Path:
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path / "tiny-m3", seed=0)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_small_checkpoint_fingerprint_hashes_the_files(ckpt):
    before = weights_fingerprint(ckpt)
    assert before["kind"] == "files" and before["num_files"] >= 1 and len(before["sha256"]) == 64
    assert weights_fingerprint(ckpt) == before  # deterministic
    _flip_last_byte(next(ckpt.glob("*.safetensors")))  # one bit of one weight, same size
    assert weights_fingerprint(ckpt)["sha256"] != before["sha256"]
    assert weights_fingerprint(None) is None and weights_fingerprint(ckpt / "nowhere") is None


def test_large_checkpoint_fingerprint_is_index_and_sizes(ckpt, monkeypatch):
    monkeypatch.setattr(prov, "SMALL_CHECKPOINT_BYTES", 0)
    assert weights_fingerprint(ckpt)["kind"] == "sizes"  # no index: names and sizes
    index = ckpt / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model.safetensors"}}))
    first = weights_fingerprint(ckpt)
    assert first["kind"] == "index"
    index.write_text(json.dumps({"weight_map": {"b": "model.safetensors"}}))
    assert weights_fingerprint(ckpt)["sha256"] != first["sha256"]
    shard = next(ckpt.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes() + b"\0")  # a shard of another size
    assert weights_fingerprint(ckpt)["sha256"] != first["sha256"]


def test_software_and_device():
    s = software()
    assert s["m3bench"] and s["torch"] and s["transformers"] and "lm_eval" in s and "triton" in s
    assert s["git_commit"] is None or len(s["git_commit"]) == 40
    cpu = device_info("cpu")
    assert cpu["driver"] is None and cpu["cuda"] is None and cpu["name"]
    assert device_info(None) == {"device": None, "name": None, "driver": None, "cuda": None}


class ConstBackend:
    name = "const"

    def score(self, requests, on_done):
        from m3bench.evals.backends.base import ScoreResult

        for i, _ in enumerate(requests):
            on_done(i, ScoreResult(-1.0, False))

    def describe(self):
        return {"model": "const", "device": "cpu"}

    def close(self):
        pass


def test_accuracy_summary_provenance_and_weights_in_the_run_key(tmp_path):
    from shared_data import SHARED_DATA

    if not (SHARED_DATA / "mmlu" / "test.jsonl").is_file():
        pytest.skip("no shared data copy")
    from m3bench.evals.protocols import Task
    from m3bench.evals.protocols.base import Settings
    from m3bench.evals.references import RunSpec
    from m3bench.evals.runner import RunPlan, run_task
    from m3bench.runtime.tiny import write_tiny_checkpoint

    keys = []
    for seed in (0, 1):
        model = write_tiny_checkpoint(tmp_path / f"m{seed}", seed=seed)
        plan = RunPlan(Task.MMLU, Settings(limit=4), "org/model", str(model), None, RunSpec(), tmp_path / "out",
                       SHARED_DATA, None, False)
        summary, _ = run_task(plan, ConstBackend(), progress=False)
        p = summary["metadata"]["provenance"]
        assert p["weights"]["sha256"] == weights_fingerprint(model)["sha256"] and p["engine"]["backend"] == "const"
        assert p["data"]["test"] == summary["metadata"]["data"]["test"]["sha256"] and p["seeds"]["limit_shuffle"] == 0
        assert p["software"]["m3bench"] and p["device"]["cuda"] is None
        keys.append(summary["run_key"])
    assert keys[0] != keys[1]  # same everything but the weights: another run


def test_sweep_results_json_has_provenance(ckpt, tmp_path):
    from typer.testing import CliRunner

    from m3bench.cli.main import app

    out = tmp_path / "sweep"
    args = ["sweep", "--model", str(ckpt), "--load-format", "dummy", "--concurrency", "1", "--isl", "8", "--osl", "2",
            "--num-prompts", "2", "--warmup", "0", "--num-kv-blocks", "8", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    p = json.loads((out / "results.json").read_text())["config"]["provenance"]
    assert p["software"]["m3bench"] and p["engine"]["model"] == str(ckpt) and p["engine"]["load_format"] == "dummy"
    assert p["weights"]["sha256"] and p["seeds"] == {"sweep": 0, "engine": 0} and p["data"]["dataset"] == "random"
