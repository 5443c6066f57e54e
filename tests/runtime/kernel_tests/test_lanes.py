"""The side lane (kernels/lanes.py) on the CPU: it runs its body inline and in order, and the split-K counters
are one buffer per lane (the GPU tests, tests/runtime/test_lanes_gpu.py, run both lanes at once)."""

from __future__ import annotations

import torch

from m3bench.runtime.kernels import lanes
from m3bench.runtime.kernels.mx_linear import split_counters


def test_off_the_gpu_the_side_lane_runs_inline_on_the_main_lane():
    x = torch.randn(3, 4)
    with lanes.SideLane(x) as side:
        assert not side.on and lanes.current_lane() == lanes.MAIN
        y = x * 2
    side.join(y)
    assert torch.equal(y, x * 2) and lanes.current_lane() == lanes.MAIN


def test_each_lane_has_its_own_split_counters(monkeypatch):
    cpu = torch.device("cpu")
    main = split_counters(cpu)
    assert split_counters(cpu, lanes.MAIN) is main
    monkeypatch.setitem(lanes._LANE, "current", lanes.SIDE)
    side = split_counters(cpu)
    assert side is split_counters(cpu, lanes.SIDE) and side is not main
    assert side.data_ptr() != main.data_ptr() and not side.any()


def test_inline_lanes_keep_a_cuda_side_lane_on_the_main_stream():
    class CudaLike:  # what SideLane reads of its `like` tensor; a real one would need a GPU
        is_cuda = True
        device = torch.device("cuda", 0)

    with lanes.inline_lanes():
        with lanes.SideLane(CudaLike()) as side:
            assert not side.on and lanes.current_lane() == lanes.MAIN
        side.join()
        with lanes.inline_lanes():  # nested: still inline, and the outer's setting comes back
            pass
        assert lanes._LANE["inline"]
    assert not lanes._LANE["inline"]
