"""Pareto frontier on hand-made points."""

from m3bench.bench.pareto import dominates, frontier


def _xy(points):
    return frontier(points, x=lambda p: p[0], y=lambda p: p[1])


def test_frontier_of_hand_made_points():
    pts = [(10, 100), (20, 80), (15, 70), (30, 50), (5, 90), (30, 40), (25, 20)]
    # (15,70) < (20,80); (5,90) < (10,100); (30,40) < (30,50); (25,20) < (30,50)
    assert _xy(pts) == [(10, 100), (20, 80), (30, 50)]


def test_ties_and_duplicates():
    assert _xy([(1, 5), (1, 10)]) == [(1, 10)]  # equal x, lower y: dominated
    assert _xy([(2, 3), (2, 3)]) == [(2, 3)]
    assert _xy([(1, 1)]) == [(1, 1)] and _xy([]) == []
    assert dominates((2, 2), (1, 2)) and not dominates((2, 2), (2, 2)) and not dominates((3, 1), (1, 3))


def test_frontier_keeps_objects():
    pts = [{"c": 1, "x": 100.0, "y": 1e3}, {"c": 4, "x": 50.0, "y": 3e3}, {"c": 16, "x": 20.0, "y": 2e3}]
    out = frontier(pts, x=lambda p: p["x"], y=lambda p: p["y"])
    assert [p["c"] for p in out] == [4, 1]
