"""benchmarks/overlap_speed.py on CPU (tiny Qwen2): both engines run, give identical tokens, and the table
has a row per batch size (the GPU figures live in docs/performance.md section 5)."""

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_cpu_smoke(tmp_path, capsys):
    bench = importlib.import_module("overlap_speed")
    out = tmp_path / "o.json"
    assert bench.main(["--cpu-smoke", "--json", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())["qwen2-tiny"]
    assert [r["batch"] for r in rows] == [1, 2] and all(r["same"] for r in rows)
    assert all(r["sync_tok_s"] > 0 and r["async_tok_s"] > 0 for r in rows)
    assert "qwen2-tiny" in capsys.readouterr().out
