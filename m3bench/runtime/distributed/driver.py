"""Rank 0's end of a tensor-parallel run: start (or join) the ranks, send each step's inputs, stop them.

    driver = start_driver(world=2, spec=spec)       # None when world is 1
    driver.alloc(num_pages, P, kv_dtype)            # every rank allocates the same KV pool
    runner.link = driver                            # a StepLink (runtime/rank_step.py): the runners send
    with driver.forward(inputs, captured=False):    #   each step's inputs, then every rank runs the step
        logits = target_logits(model, kv, inputs)
    driver.shutdown()                               # STOP, join; terminate whatever hangs

Under torchrun, ranks > 0 call `start_driver` too: it serves rank 0 until STOP, then raises SystemExit(0).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from m3bench.runtime.distributed.groups import (
    RankGroups,
    destroy_groups,
    init_groups,
    rank_device,
    torchrun_rank,
)
from m3bench.runtime.distributed.launcher import WorkerPool, spawn_ranks
from m3bench.runtime.distributed.protocol import (
    Op,
    kv_code,
    send_draft,
    send_forward,
    send_header,
    send_picks,
)
from m3bench.runtime.distributed.worker import WorkerSpec, agree_min, serve
from m3bench.runtime.errors import InputError
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.parallel import TPGroup
from m3bench.runtime.rank_step import StepLink

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 10.0  # STOP and the group teardown, before the workers are terminated instead


class Driver(StepLink):
    tensor_parallel = True

    def __init__(self, groups: RankGroups, pool: WorkerPool | None) -> None:
        self.groups, self.pool = groups, pool
        self.in_step = False  # a step's messages are in flight: STOP could not be heard
        self.broken: str | None = None
        self.closed = False
        self._lock = threading.Lock()
        if pool is not None:
            pool.on_death = self._on_death

    @property
    def tp(self) -> TPGroup:
        return self.groups.tp

    @property
    def device(self) -> torch.device:
        return self.groups.device

    def alloc(self, num_pages: int, P: int, kv_dtype: KVDtype) -> None:
        with self.guard():
            send_header(self.groups.control, Op.ALLOC, (num_pages, P, kv_code(kv_dtype)))

    def start_profile(self, tokens: int, P: int, kv_dtype: KVDtype, page_bytes: int, utilization: float) -> None:
        with self.guard():
            send_header(self.groups.control, Op.PROFILE,
                        (tokens, P, kv_code(kv_dtype), page_bytes, round(utilization * 1e6)))

    def alloc_draft(self, num_pages: int, page_size: int, kv_dtype: KVDtype) -> None:
        with self.guard():
            send_header(self.groups.control, Op.ALLOC_DRAFT, (num_pages, page_size, kv_code(kv_dtype)))

    def agree_min(self, value: int) -> int:
        with self.guard():
            return agree_min(self.groups.control, value)

    @contextmanager
    def forward(self, x: Any, captured: bool) -> Iterator[None]:
        """Send the target forward's inputs, then run it here (inside the block) as every rank does."""
        with self.in_flight():
            send_forward(self.groups.control, self.tp, x, captured)
            yield

    @contextmanager
    def draft(self, d: Any) -> Iterator[None]:
        with self.in_flight():
            send_draft(self.groups.control, self.tp, d)
            yield

    def picks(self, tokens: torch.Tensor) -> torch.Tensor:
        with self.guard():
            send_picks(self.tp, tokens)
        return tokens

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """A step's messages are in flight (a STOP now could not be heard) until the block ends without error."""
        self.in_step = True
        with self.guard():
            yield
        self.in_step = False

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Refuse to talk to dead ranks; turn a failed collective into one clear RuntimeError."""
        self.check()
        try:
            yield
        except RuntimeError as e:  # gloo: "Connection closed by peer"; NCCL: aborted / timed out
            raise self.failure(e) from e

    def check(self) -> None:
        if self.closed:
            raise RuntimeError("this LLM's tensor-parallel workers were shut down")
        if self.broken is None and self.pool is not None and self.pool.dead():
            self.broken = self.pool.describe_death()
        if self.broken is not None:
            raise RuntimeError(f"{self.broken}; the tensor-parallel engine cannot continue")

    def failure(self, exc: BaseException) -> RuntimeError:
        death = self.pool.describe_death() if self.pool is not None else None
        self.broken = death or f"a tensor-parallel collective failed ({str(exc).splitlines()[0][:200]})"
        return RuntimeError(f"{self.broken}; the tensor-parallel engine cannot continue")

    def _on_death(self) -> None:
        """Watch thread: a worker died. NCCL would wait out its timeout: abort so rank 0's collective fails."""
        self.broken = self.broken or self.pool.describe_death()
        if self.device.type == "cuda" and not self.closed:
            try:
                from torch.distributed.distributed_c10d import _abort_process_group

                _abort_process_group()
            except Exception as e:  # noqa: BLE001 - best effort; the step then fails on its own timeout
                log.warning("could not abort the NCCL process group: %s", e)

    def shutdown(self) -> None:
        """STOP the other ranks when they can hear it, then make sure every worker process is gone."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        graceful = not self.in_step and self.broken is None
        hung = False
        if graceful:
            graceful, hung = _within(STOP_TIMEOUT_S, self._stop_ranks)
        if self.pool is not None:
            self.pool.stop(graceful)  # not graceful: terminate, which also ends a collective left hanging
        if not graceful and not hung:
            _destroy_quietly(self.groups)

    def _stop_ranks(self) -> None:
        send_header(self.groups.control, Op.STOP)
        destroy_groups(self.groups)


def start_driver(world: int, spec: WorkerSpec) -> Driver | None:
    """Rank 0's Driver (spawning ranks 1..world-1, or joining torchrun's); None for world 1."""
    if world < 1:
        raise InputError(f"tensor_parallel_size must be >= 1, got {world}")
    if world == 1:
        return None
    check_fits(spec, world)
    launched = torchrun_rank(world)
    if launched is not None:
        return _join_torchrun(world, spec, *launched)
    return _register(Driver(*spawn_ranks(world, spec)))


def check_fits(spec: WorkerSpec, world: int) -> None:
    """Refuse a TP size the model's heads, vocabulary, experts or intermediate sizes do not split over,
    before any process starts (a shape-only model on the meta device raises what a rank would)."""
    from pathlib import Path

    from m3bench.runtime.config import ModelConfig
    from m3bench.runtime.model import M3ForCausalLM

    if spec.config is None and spec.model is None:
        return  # building the model reports the missing directory
    cfg = spec.config if isinstance(spec.config, ModelConfig) else ModelConfig.from_pretrained(
        Path(spec.config or spec.model))
    try:
        M3ForCausalLM(cfg, spec.dtype, "meta", TPGroup(0, world))
    except ValueError as e:
        raise InputError(f"tensor_parallel_size {world} does not fit this model: {e}") from None


def _join_torchrun(world: int, spec: WorkerSpec, rank: int, local_rank: int) -> Driver:
    groups = init_groups(rank, world, "env://", rank_device(spec.device, local_rank))
    if rank == 0:
        return _register(Driver(groups, None))
    serve(spec, groups)  # ranks > 0 are workers until rank 0 stops
    destroy_groups(groups)
    raise SystemExit(0)


def _within(timeout_s: float, fn: Any) -> tuple[bool, bool]:
    """Run fn on a daemon thread: (it finished without error, it is still running after timeout_s). Keeps
    an interrupted process from waiting forever on a STOP its peers cannot hear (e.g. Ctrl-C mid-message)."""
    done, failed = threading.Event(), []

    def run() -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a failed STOP means: stop the workers the hard way
            failed.append(e)
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="m3bench-tp-stop", daemon=True).start()
    except RuntimeError:  # no new threads at interpreter shutdown (atexit, Python >= 3.12): run it here
        run()
    finished = done.wait(timeout_s)
    return finished and not failed, not finished


def _destroy_quietly(groups: RankGroups) -> None:
    try:
        destroy_groups(groups)
    except Exception as e:  # noqa: BLE001 - the peers are gone; nothing is left to release cleanly
        log.debug("destroying the process group after a failure: %s", e)


def _register(driver: Driver) -> Driver:
    atexit.register(driver.shutdown)
    return driver
