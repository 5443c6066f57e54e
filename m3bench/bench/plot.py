"""The sweep's picture: interactivity x90 (tok/s/user) against total tok/s per GPU, frontier per TP.

    plot_pareto(rows, Path("pareto.png"), baseline_rows=previous_rows)

`rows` are the flat result rows of a sweep (keys `tp`, `concurrency`, `interactivity_x90`,
`total_tok_per_s_per_gpu`). Rendered with the Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from m3bench.bench.pareto import frontier

X_KEY = "interactivity_x90"
Y_KEY = "total_tok_per_s_per_gpu"


def _frontier_xy(rows: Sequence[Mapping]) -> tuple[list[float], list[float]]:
    front = frontier(rows, x=lambda r: r[X_KEY], y=lambda r: r[Y_KEY])
    return [r[X_KEY] for r in front], [r[Y_KEY] for r in front]


def plot_pareto(
    rows: Sequence[Mapping], path: Path, baseline_rows: Sequence[Mapping] = (), title: str = "m3bench sweep"
) -> Path:
    """Write a PNG of every point, the frontier of each TP, and (dashed) the baseline's frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    for tp in sorted({int(r["tp"]) for r in rows}):
        group = [r for r in rows if int(r["tp"]) == tp]
        line = ax.plot(*_frontier_xy(group), marker="o", label=f"TP{tp} frontier")[0]
        ax.scatter([r[X_KEY] for r in group], [r[Y_KEY] for r in group], color=line.get_color(), alpha=0.5, s=18)
        for r in group:
            ax.annotate(f"C{r['concurrency']}", (r[X_KEY], r[Y_KEY]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    if baseline_rows:
        ax.plot(*_frontier_xy(baseline_rows), linestyle="--", color="gray", marker="x", label="baseline frontier")
    ax.set_xlabel("interactivity x90 = 1000 / P90 TPOT (tok/s/user)")
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
