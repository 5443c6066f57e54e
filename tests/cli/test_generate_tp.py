"""`m3bench generate --tp 2` on CPU (a spawned gloo worker) prints what --tp 1 prints."""

import json
import multiprocessing

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app
from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

SPEC = TinySpec(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rotary_dim=8, dense_intermediate_size=48, num_experts=4, top_k=2, intermediate_size=16,
                shared_intermediate_size=16, index_dim=16, block_size=16, max_position_embeddings=512)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_tp"), seed=0, spec=SPEC)


def _run(ckpt, tp: int):
    args = ["generate", "--model", str(ckpt), "--prompt", "hello world", "--prompt-ids", "5,6,7,8", "--max-tokens",
            "6", "--json", "--tokens-per-block", "16", "--kv-cache-dtype", "auto", "--tp", str(tp)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def test_tp2_prints_the_tp1_tokens(ckpt):
    one, two = _run(ckpt, 1), _run(ckpt, 2)
    assert len(one) == 2 and [r["token_ids"] for r in one] == [r["token_ids"] for r in two]
    assert not multiprocessing.active_children()


def test_tp_that_does_not_split_the_heads_exits_2(ckpt):
    res = CliRunner().invoke(app, ["generate", "--model", str(ckpt), "--prompt-ids", "1,2", "--tp", "3"])
    assert res.exit_code == 2 and "3" in res.output
