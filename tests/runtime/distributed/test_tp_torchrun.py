"""Under torchrun every rank runs the same script: rank 0's LLM(...) drives, the others' serve it and
exit 0 when rank 0 is done; rank 0 prints what a TP-1 engine prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tp_helpers import P, tiny_checkpoint

from m3bench.runtime import LLM, SamplingParams

SCRIPT = """
import json, os, sys
from m3bench.runtime import LLM, SamplingParams

llm = LLM(sys.argv[1], kv_cache_dtype="auto", tokens_per_block=16, tensor_parallel_size=2)
out = llm.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=6))
print("RANK", os.environ["RANK"], json.dumps(out[0].token_ids), flush=True)
"""


def test_torchrun_two_ranks_match_tp1(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(ckpt)]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line.split(" ", 2) for line in res.stdout.splitlines() if line.startswith("RANK")]
    assert [r for _, r, _ in lines] == ["0"]  # rank 1 served, then exited quietly
    want = LLM(ckpt, kv_cache_dtype="auto", tokens_per_block=P).generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=6))
    assert json.loads(lines[0][2]) == want[0].token_ids
