"""benchmarks/spec_overhead.py on CPU (tiny TP8/EP8 rank, both routings): every row of the table carries the
step, its parts, the plain step and the gains, finite and positive (the goals themselves need the H200)."""

import importlib
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_cpu_smoke_table(tmp_path, capsys):
    bench = importlib.import_module("spec_overhead")
    out = tmp_path / "rows.json"
    assert bench.main(["--cpu-smoke", "--routing", "all-local", "realistic", "--draft", "early", "late",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    keys = {(r["routing"], r["al"], r["batch"], r["draft"]) for r in rows}
    assert keys == {(ro, al, b, m) for ro in ("all-local", "realistic") for al in (2.8, 3.5) for b in (1, 2)
                    for m in ("early", "late")}
    for r in rows:
        early = r["draft"] == "early"
        parts = [r["parts"][k] for k in (("verify_ms", "early_ms") if early else ("verify_ms", "extend_ms", "chain_ms"))]
        values = [r["spec_over_parts"], r["predicted_gain"], r["achieved_gain"], r["achieved_over_predicted"],
                  r["parts_ms"], r["plain"]["step_ms"], r["spec"]["step_ms"], r["spec"]["host_ms_p90"], *parts]
        assert all(math.isfinite(v) and v > 0 for v in values), r
        assert r["early_share"] == (1.0 if early else 0.0)  # the mode reached the engine's steps
        assert r["spec"]["host_ms_p50"] >= 0 and r["graph_share"] == 1.0  # every timed step replayed the verify graph
        assert r["spec"]["tokens_per_request_step"] > 1 and r["plain"]["tokens_per_request_step"] == 1
        assert 1 <= r["experts_per_layer"] <= 4  # TINY_RANK: 4 local experts
    local = {(r["al"], r["batch"]): r["experts_per_layer"] for r in rows if r["routing"] == "all-local"}
    real = {(r["al"], r["batch"]): r["experts_per_layer"] for r in rows if r["routing"] == "realistic"}
    assert sum(local.values()) > sum(real.values())  # the routing switch reaches the engine's steps
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "spec ms" in line)
    assert all(c in header for c in bench.COLUMNS)
    assert printed.count("realistic") >= 4
