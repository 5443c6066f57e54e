"""benchmarks/moe_picks.py: the tiny run end to end (interpreter): every pick count checked against the reference,
a pick count's picks local and the rest another rank's (-1)."""

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("moe_picks")


def test_picks_name_local_experts_first_and_rotate(bench):
    from mxfp8_gpu import Shapes

    sh = Shapes()
    p = bench.picks(2, 3, sh, torch.device("cpu"))
    assert p["topk_ids"].tolist() == [[12, 13, -1, -1]]  # call 3: experts 12, 13 of 16, then another rank's
    assert bench.picks(0, 0, sh, torch.device("cpu"))["topk_ids"].tolist() == [[-1] * 4]
    assert bench.picks(4, 7, sh, torch.device("cpu"))["topk_ids"].tolist() == [[12, 13, 14, 15]]


def test_tiny_run_checks_every_pick_count(bench, capsys, triton_interpreter):
    assert bench.main(["--tiny"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("bf16", "mxfp8"))]
    assert [(r.split()[0], int(r.split()[1])) for r in rows] == [
        (f, n) for f in ("bf16", "bf16-split", "mxfp8", "mxfp8-split") for n in range(3)]
