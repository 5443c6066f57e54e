"""`m3bench sweep --tp 1,2` with the bundled engine on CPU: one engine per TP size (TP 2 spawns a
gloo worker), every point measured, throughput per GPU divided by the TP size, no worker left."""

from __future__ import annotations

import json
import multiprocessing

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_tp"), seed=2)


def test_sweep_over_tp_1_and_2(tiny_ckpt, tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "--model", str(tiny_ckpt), "--tp", "1,2", "--concurrency", "1", "--isl", "16", "--osl", "4",
            "--num-prompts", "2", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    points = json.loads((out / "results.json").read_text())["points"]
    assert [(p["tp"], p["concurrency"]) for p in points] == [(1, 1), (2, 1)]
    for p in points:
        assert p["num_completed"] == 2 and p["num_failed"] == 0 and p["total_output_tokens"] == 8
        assert p["num_wrong_output_len"] == 0 and p["total_tok_per_s_per_gpu"] > 0
    assert not multiprocessing.active_children()  # the TP 2 engine's worker stopped with it
