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
        (f, n) for e in ("bf16", "mxfp8") for f in (e, f"{e}-split", f"{e}-split-down2", f"{e}-split-down4", f"{e}-gemv")
        for n in range(3)]


def test_tiny_sweep_times_the_rule_and_candidates_checked(bench, capsys, triton_interpreter):
    """--sweep: every candidate checked against the reference at one pick, then the best and the rule at 0-3 picks
    with their B1 mix."""
    assert bench.main(["--tiny", "--sweep"]) == 0
    out = capsys.readouterr().out
    assert "bf16   rule" in out and "mxfp8  rule" in out and "bf16   bn32 bk64 split1 down16" in out
    mixes = [line.split() for line in out.splitlines() if line.split()[-2:-1] == ["mix"]]
    assert {m[0] for m in mixes} == {"bf16", "mxfp8"} and len(mixes) <= 4  # the best one and the rule, each
    assert [m[0] for m in mixes if m[1] == "rule" and m[2].startswith("0:")] == ["bf16", "mxfp8"]  # not "rule down2"
    assert all(float(m[-1]) > 0 for m in mixes)


def test_sweep_candidates_divide_the_hidden_size(bench):
    from mxfp8_gpu import Shapes

    sh = Shapes()
    for quantized in (False, True):
        ex = bench.Experts("x", {}, 1, (), quantized)
        cands = bench.candidates(ex, sh)
        gemv = [t for _, t in cands if t.gemv]
        assert len(gemv) == 2 * 3 * 3 * 2 and all(sh.inter % t.block_k == 0 for t in gemv)  # the one-token GEMVs
        assert cands[0][0] == "rule" and len(cands) - len(gemv) == 2 + 2 * (1 if quantized else 2) * 4 * 3
        assert cands[0][1].split_down == 2  # the runtime's
        assert [n for n, t in cands[1:3]] == ["rule down1", "rule down4"] and cands[2][1].split_down == 4
        assert [t for _, t in cands].count(cands[0][1]) == 1
        assert all(sh.hidden % (t.split_k * t.block_k) == 0 for _, t in cands)
