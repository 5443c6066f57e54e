"""benchmarks/topk_speed.py: the tiny run end to end (interpreter), and a wrong selection failing it."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("topk_speed")


def test_tiny_run_checks_and_times_every_kernel(bench, tmp_path, triton_interpreter):
    out = tmp_path / "topk.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} == {"msa-topk"}
    assert len(rows) == 6 and all(r["same"] and r["old_us"] > 0 and r["new_us"] > 0 for r in rows)


def test_a_wrong_selection_fails_the_run(bench, monkeypatch, triton_interpreter):
    select = bench.select_top_blocks

    def reversed_ties(scores, out, *args, **kw):
        select(scores.flip(-1), out, *args, **kw)  # other blocks: the row read back to front

    monkeypatch.setattr(bench, "select_top_blocks", reversed_ties)
    assert bench.main(["--tiny"]) == 1
