"""`m3bench generate --tp 2` on MXFP8 / NVFP4 checkpoints (sharded fp8 weights and scales) prints the --tp 1 tokens."""

import json
import multiprocessing

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app
from m3bench.runtime.tiny import Layout, TinySpec, write_tiny_checkpoint
from m3bench.runtime.tiny_quant import TinyQuant

# every split input dimension stays a multiple of 32 at TP 2 (the MXFP8 scale block)
SPEC = TinySpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rotary_dim=8, dense_intermediate_size=64, num_experts=4, top_k=2, intermediate_size=32,
                shared_intermediate_size=64, index_dim=16, block_size=16, max_position_embeddings=512)


@pytest.mark.parametrize("quant", [TinyQuant.MXFP8, TinyQuant.NVFP4])
def test_tp2_quantized_prints_the_tp1_tokens(tmp_path, quant):
    ckpt = write_tiny_checkpoint(tmp_path / quant.value, seed=1, layout=Layout.VL, shards=2, spec=SPEC, weights=quant)
    runs = []
    for tp in (1, 2):
        args = ["generate", "--model", str(ckpt), "--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--json",
                "--tokens-per-block", "16", "--tp", str(tp)]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        runs.append([json.loads(line)["token_ids"] for line in res.stdout.splitlines() if line.startswith("{")])
    assert runs[0] == runs[1] and len(runs[0][0]) == 6
    assert not multiprocessing.active_children()
