"""`m3bench accuracy` killed mid-run (SIGKILL) and rerun: same summary as an uninterrupted run, no item twice."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from accuracy_cli import accuracy_cmd, accuracy_env
from shared_data import SHARED_DATA as SHARED

pytestmark = [pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy"), pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-m3")



def _wait_for_lines(path: Path, proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text().count("\n") >= 1:
            return path.read_text().count("\n")
        time.sleep(0.02)
    return 0


def test_kill_and_resume_gives_the_same_summary(tiny, tmp_path):
    args = ("--task", "mmlu", "--limit", "10", "--no-reference", "--max-batch-size", "8")  # 40 pairs: 5 saved chunks
    out = tmp_path / "out"
    proc = subprocess.Popen(accuracy_cmd(tiny, out, *args), env=accuracy_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    items = None
    deadline = time.monotonic() + 120
    while items is None and time.monotonic() < deadline and proc.poll() is None:
        found = list(out.glob("mmlu-*.items.jsonl"))
        items = found[0] if found else None
        time.sleep(0.02)
    assert items is not None, proc.communicate()[1].decode()[-2000:]
    assert _wait_for_lines(items, proc, 120) >= 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = items.read_text().count("\n")
    assert 1 <= partial < 10, "the run finished before it could be killed"

    resumed = subprocess.run(accuracy_cmd(tiny, out, *args), env=accuracy_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(Path(resumed.stdout.strip().splitlines()[-1]).read_text())
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 10  # nothing scored twice

    fresh = subprocess.run(accuracy_cmd(tiny, tmp_path / "fresh", *args), env=accuracy_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    clean = json.loads(Path(fresh.stdout.strip().splitlines()[-1]).read_text())
    for key in ("score", "stderr", "n", "metrics", "subjects", "categories", "run_key"):
        assert summary[key] == clean[key], key


