"""The engine's own clock: wall time of each engine step, and the forward time within it.

    clock = StepClock(device)                    # LLM.step runs under clock.step(); runners under clock.forward()
    mark = clock.mark()
    ...                                          # the measured window
    records = clock.since(mark)                  # [StepRecord(step_s, forward_s)], raw facts
    bench.metrics.compute_host_timing(records, window_s)   # host ms per step (median, p90), device idle share

"Forward" is the model's forward passes and logits (target and Eagle3 draft, eager or graph replay);
everything else in a step (scheduling, inputs, sampling, verification, postprocessing) is host work.
On CPU the forward is timed on the host (it is the host's own compute); on CUDA with CUDA events
around the same calls (device time, read once the events completed, without syncing the step).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

MAX_RECORDS = 200_000  # steps kept (a long-running server forgets the oldest)


@dataclass(frozen=True)
class StepRecord:
    step_s: float  # wall time of one engine step on the host
    forward_s: float  # its forward time (host compute on CPU, device time on CUDA)


class StepClock:
    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self._records: deque = deque(maxlen=MAX_RECORDS)  # (step_s, [forward timings]) per step
        self._count = 0  # steps ever recorded (marks stay valid after the deque drops old steps)
        self._open: list[Any] | None = None  # the forwards of the step in progress
        self._unread: deque = deque()  # CUDA: forward lists whose events may not have completed yet
        self._lock = threading.Lock()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time one engine step (nested calls count once)."""
        if self._open is not None:
            yield
            return
        self._open, start = [], time.perf_counter()
        try:
            yield
        finally:
            record = (time.perf_counter() - start, self._open)
            self._open = None
            with self._lock:
                self._records.append(record)
                self._count += 1
                self._read_completed(record[1])

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Time one forward (+ logits) of the target or the draft inside the current step."""
        if self._open is None:  # outside a step (profiling, graph capture): not an engine step
            yield
            return
        if self.cuda:
            yield from self._cuda_forward()
            return
        start = time.perf_counter()
        yield
        self._open.append(time.perf_counter() - start)

    def _cuda_forward(self) -> Iterator[None]:
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._open.append((begin, end))

    def _read_completed(self, forwards: list[Any]) -> None:
        """CUDA: turn the event pairs of completed steps into seconds (steps complete in order), so only the
        steps still in flight hold events."""
        if not self.cuda:
            return
        self._unread.append(forwards)
        while self._unread and all(end.query() for _, end in _pairs(self._unread[0])):
            done = self._unread.popleft()
            done[:] = [_seconds(f) for f in done]

    @property
    def in_flight(self) -> int:
        """Steps whose CUDA events are not read yet (0 on CPU)."""
        return len(self._unread)

    def mark(self) -> int:
        """A point in the step sequence; `since(mark)` returns the steps after it."""
        with self._lock:
            return self._count

    def since(self, mark: int) -> list[StepRecord]:
        """The steps recorded after `mark` (the oldest may have been dropped past MAX_RECORDS)."""
        with self._lock:
            n = min(self._count - mark, len(self._records))
            recent = list(self._records)[len(self._records) - n:] if n > 0 else []
        return [StepRecord(step_s, sum(_seconds(f) for f in forwards)) for step_s, forwards in recent]


def _pairs(forwards: list[Any]) -> list[Any]:
    return [f for f in forwards if not isinstance(f, float)]


def _seconds(timing: Any) -> float:
    if isinstance(timing, float):
        return timing
    begin, end = timing
    end.synchronize()  # completed long ago for a finished step; never called inside the step loop
    return begin.elapsed_time(end) / 1e3


class NoClock:
    """The clock of a runner not built by engine_builder (tests): times nothing."""

    @contextmanager
    def forward(self) -> Iterator[None]:
        yield


NO_CLOCK = NoClock()
