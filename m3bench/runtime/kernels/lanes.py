"""Two lanes of work inside one layer: the main CUDA stream and a side stream beside it.

    with SideLane(x, on=True) as side:   # side.on: CUDA and asked for; else the body runs inline, in order
        h = shared_gate_up(x)            # launched on the side stream, after everything queued on main so far
    ...                                  # main-stream work, concurrent with the side's
    side.join(h)                         # main waits for the side; h may be used on main from here

At a TP8/EP8 rank's decode shapes a layer is a chain of latency-bound launches, some of which do not depend
on each other (the shared expert's gate|up reads the same input as the router). On a second stream they run
at the same time, inside a CUDA graph too (capture records the fork and the join as graph edges).

Kernels that keep per-launch scratch state on the device (the split-K counters of kernels/mx_linear.py) key it
by `current_lane()`, so a side launch never shares counters with a concurrent main one.
"""

from __future__ import annotations

import contextlib

import torch

MAIN, SIDE = 0, 1
_LANE = {"current": MAIN, "inline": False}
_STREAMS: dict[int, torch.cuda.Stream] = {}


@contextlib.contextmanager
def inline_lanes():
    """Side lanes opened inside run their work inline, in order on the main stream: the same kernels on the same
    inputs with no concurrency, to check that running beside changes no result (tests, diagnostics)."""
    before = _LANE["inline"]
    _LANE["inline"] = True
    try:
        yield
    finally:
        _LANE["inline"] = before


def current_lane() -> int:
    """MAIN, or SIDE inside a SideLane that runs on the side stream."""
    return _LANE["current"]


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's side stream (one per device, made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


class SideLane:
    """A context whose CUDA launches go to the side stream after the main stream's queued work (see module)."""

    def __init__(self, like: torch.Tensor, on: bool = True):
        self.on = bool(on) and like.is_cuda and not _LANE["inline"]
        self.main = torch.cuda.current_stream(like.device) if self.on else None
        self.side = side_stream(like.device) if self.on else None
        self._ctx = None

    def __enter__(self) -> "SideLane":
        if self.on:
            if _LANE["current"] != MAIN:
                raise RuntimeError("side lanes do not nest")
            self.side.wait_stream(self.main)
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
            _LANE["current"] = SIDE
        return self

    def __exit__(self, *exc) -> bool:
        if self._ctx is not None:
            _LANE["current"] = MAIN
            self._ctx.__exit__(*exc)
            self._ctx = None
        return False

    def join(self, *made: torch.Tensor | None) -> None:
        """The main stream waits for the side's work; tensors made on the side are marked as used on main (so the
        allocator does not hand their memory to the side stream while main still reads them)."""
        if not self.on:
            return
        self.main.wait_stream(self.side)
        for t in made:
            if t is not None:
                t.record_stream(self.main)
