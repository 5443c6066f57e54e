"""End to end: `m3bench accuracy --backend openai` against `m3bench serve` (tiny checkpoint, CPU, fp32) gives
the same per-item MMLU predictions (scored by echo + logprobs) and GSM8K answers as `--backend runtime`."""

import glob
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shared_data import SHARED_DATA as DATA

COMMON = ["--limit", "4", "--no-reference", "--num-fewshot", "1", "--max-tokens", "24",
          "--no-progress", "--data-dir", str(DATA)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"m3bench serve exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("m3bench serve did not become healthy")


def _accuracy(model: str, out: Path, *backend: str, tasks: tuple[str, ...] = ("mmlu", "gsm8k")
              ) -> dict[str, dict[str, dict]]:
    cmd = [sys.executable, "-m", "m3bench", "accuracy", "--model", model, "--out", str(out), *backend, *COMMON,
           "--task", ",".join(tasks)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    items = {}
    for task in tasks:
        (path,) = glob.glob(str(out / f"{task}-*.items.jsonl"))
        items[task] = {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}
    return items


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    if not (DATA / "mmlu" / "test.jsonl").is_file() or not (DATA / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"MMLU / GSM8K data not found under {DATA}")
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0)


def test_openai_backend_against_serve_equals_runtime_backend(ckpt, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([sys.executable, "-m", "m3bench", "serve", "--model", str(ckpt), "--port", str(port),
                              "--dtype", "float32", "--kv-cache-dtype", "auto", "--served-model-name", "tiny-served"],
                             env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(url, serve)
        served = _accuracy(str(ckpt), tmp_path / "openai", "--backend", "openai", "--base-url", url)
        # a model name, not a directory: no local tokenizer, the continuation is found from the echoed text_offset
        by_offset = _accuracy("tiny-served", tmp_path / "offsets", "--backend", "openai", "--base-url", url,
                              tasks=("mmlu",))
    finally:
        serve.terminate()
        serve.wait(timeout=20)
    local = _accuracy(str(ckpt), tmp_path / "runtime", "--backend", "runtime", "--device", "cpu", "--dtype", "float32",
                      "--kv-cache-dtype", "auto")
    for mmlu in (served["mmlu"], by_offset["mmlu"]):
        assert mmlu.keys() == local["mmlu"].keys() and len(local["mmlu"]) == 4
        for item_id, want in local["mmlu"].items():
            got = mmlu[item_id]
            assert got["extracted"] == want["extracted"], item_id
            assert [c["logprob"] for c in got["raw_output"]] == pytest.approx(
                [c["logprob"] for c in want["raw_output"]], abs=1e-3)
    assert served["gsm8k"].keys() == local["gsm8k"].keys() and len(local["gsm8k"]) == 4
    for item_id, want in local["gsm8k"].items():
        assert served["gsm8k"][item_id]["extracted_by_metric"] == want["extracted_by_metric"], item_id


def test_mmlu_against_serve_with_draft_scores_with_the_target_alone(ckpt, tmp_path):
    """Loglikelihood requests (echo + logprobs, max_tokens 0) against `serve --draft`: the target scores them,
    with the same per-item predictions and logprobs as the runtime backend without a draft."""
    from m3bench.runtime.speculative.tiny_draft import shipped_tiny_eagle3

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([sys.executable, "-m", "m3bench", "serve", "--model", str(ckpt), "--port", str(port),
                              "--dtype", "float32", "--kv-cache-dtype", "auto", "--draft", str(shipped_tiny_eagle3()),
                              "--draft-len", "3"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(url, serve)
        served = _accuracy(str(ckpt), tmp_path / "openai", "--backend", "openai", "--base-url", url, tasks=("mmlu",))
    finally:
        serve.terminate()
        serve.wait(timeout=20)
    local = _accuracy(str(ckpt), tmp_path / "runtime", "--backend", "runtime", "--device", "cpu", "--dtype", "float32",
                      "--kv-cache-dtype", "auto", tasks=("mmlu",))
    assert served["mmlu"].keys() == local["mmlu"].keys() and len(local["mmlu"]) == 4
    for item_id, want in local["mmlu"].items():
        got = served["mmlu"][item_id]
        assert got["extracted"] == want["extracted"], item_id
        assert [c["logprob"] for c in got["raw_output"]] == pytest.approx(
            [c["logprob"] for c in want["raw_output"]], abs=1e-3)
