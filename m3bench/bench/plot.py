"""The sweep's picture: interactivity x90 (or E2E-normalized P90, `x_axis`; tok/s/user) against
total tok/s per GPU, frontier per TP.

    plot_pareto(rows, Path("pareto.png"), baseline_rows=previous_rows)

`rows` are the flat result rows of a sweep (keys `tp`, `concurrency`, `interactivity_x90`,
`total_tok_per_s_per_gpu`). Rendered with the Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from m3bench.bench.pareto import ParetoX, frontier

X_KEY = "interactivity_x90"
Y_KEY = "total_tok_per_s_per_gpu"


def _frontier_xy(rows: Sequence[Mapping], x_key: str = X_KEY) -> tuple[list[float], list[float]]:
    front = frontier(rows, x=lambda r: r[x_key], y=lambda r: r[Y_KEY])
    return [r[x_key] for r in front], [r[Y_KEY] for r in front]


def plot_pareto(
    rows: Sequence[Mapping], path: Path, baseline_rows: Sequence[Mapping] = (), title: str = "m3bench sweep",
    x_axis: ParetoX = ParetoX.X90,
) -> Path:
    """Write a PNG of every point, the frontier of each TP, and (dashed) the baseline's frontier."""
    x_key = x_axis.key
    baseline_rows = [r for r in baseline_rows if r.get(x_key) is not None]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    for tp in sorted({int(r["tp"]) for r in rows}):
        group = [r for r in rows if int(r["tp"]) == tp]
        line = ax.plot(*_frontier_xy(group, x_key), marker="o", label=f"TP{tp} frontier")[0]
        ax.scatter([r[x_key] for r in group], [r[Y_KEY] for r in group], color=line.get_color(), alpha=0.5, s=18)
        for r in group:
            ax.annotate(f"C{r['concurrency']}", (r[x_key], r[Y_KEY]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    if baseline_rows:
        ax.plot(*_frontier_xy(baseline_rows, x_key), linestyle="--", color="gray", marker="x", label="baseline frontier")
    ax.set_xlabel(x_axis.label)
    ax.set_ylabel("total tok/s per GPU")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
