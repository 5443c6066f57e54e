"""The Pareto frontier of a sweep: interactivity (tok/s/user, x) against throughput per GPU (y).

The x axis is a choice (`ParetoX`): x90 = 1000 / P90 TPOT_ms (the default), or E2E-normalized
interactivity at P90 = 1 / P90(E2EL_s / OSL) (InferenceX AgentX's axis); definitions in bench/metrics.py.

A point is on the frontier when no other point is at least as good on both axes and strictly
better on one (weak ties on one axis do not keep a point that loses on the other). Both axes are
"higher is better".
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


class ParetoX(str, Enum):
    X90 = "x90"
    E2E_P90 = "e2e-p90"

    @property
    def key(self) -> str:
        """The result row's field of this axis."""
        return {ParetoX.X90: "interactivity_x90", ParetoX.E2E_P90: "interactivity_e2e_p90"}[self]

    @property
    def label(self) -> str:
        return {ParetoX.X90: "interactivity x90 = 1000 / P90 TPOT (tok/s/user)",
                ParetoX.E2E_P90: "E2E-normalized interactivity P90 = 1 / P90(E2EL / OSL) (tok/s/user)"}[self]


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a is at least as good as b on both axes and strictly better on one."""
    return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])


def frontier(points: Sequence[T], x: Callable[[T], float], y: Callable[[T], float]) -> list[T]:
    """The non-dominated points, sorted by increasing x (so by decreasing y); duplicates kept once."""
    xy = [(float(x(p)), float(y(p))) for p in points]
    keep: list[tuple[tuple[float, float], T]] = []
    seen: set[tuple[float, float]] = set()
    for i, p in enumerate(points):
        if xy[i] in seen or any(dominates(other, xy[i]) for other in xy):
            continue
        seen.add(xy[i])
        keep.append((xy[i], p))
    keep.sort(key=lambda item: item[0])
    return [p for _, p in keep]
