"""The sweep plot is written as a non-empty PNG."""

from m3bench.bench.plot import plot_pareto


def _rows(scale):
    out = []
    for tp in (1, 2):
        for i, c in enumerate((1, 4, 16)):
            out.append({"tp": tp, "concurrency": c, "interactivity_x90": 100.0 / (i + 1) * scale,
                        "total_tok_per_s_per_gpu": 50.0 * c / tp * scale})
    return out


def test_plot_written_and_non_empty(tmp_path):
    path = plot_pareto(_rows(1.0), tmp_path / "sub" / "pareto.png", baseline_rows=_rows(0.9))
    data = path.read_bytes()
    assert len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n"
