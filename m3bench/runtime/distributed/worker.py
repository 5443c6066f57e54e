"""Ranks > 0: build this rank's shards of the model, then run each step rank 0 sends until STOP.

A worker holds no scheduler, block manager or sampler: each step's inputs come from rank 0 whole
(token ids, positions, slots, block tables, logits rows; for the draft its rows and page tables), and it
runs them with the functions rank 0's runners run (runtime/rank_step.target_logits,
speculative/draft_step.run_draft). Its KV pools have rank 0's page count, so rank 0's slots are valid here.

    serve(spec, groups)        # under torchrun, from LLM(...) on ranks > 0
    spawned_main(...)          # the entry point of a worker process that m3bench spawned
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from m3bench.runtime.distributed.groups import (
    RankGroups,
    destroy_groups,
    init_groups,
    rank_device,
)
from m3bench.runtime.distributed.protocol import (
    KV_DTYPES,
    Op,
    receive_draft,
    receive_forward,
    receive_picks,
    recv_header,
)
from m3bench.runtime import model_builder
from m3bench.runtime.engine_config import EngineConfig
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.rank_step import target_logits
from m3bench.runtime.speculative.draft_step import run_draft

PARENT_POLL_S = 0.5


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank needs to build the same model as rank 0: its resolved EngineConfig."""

    engine: EngineConfig
    config: Any = None  # a ModelConfig, or a directory holding config.json (default: engine.model)

    @property
    def model(self) -> str | None:
        return None if self.engine.model is None else str(self.engine.model)

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def dtype(self) -> torch.dtype:
        return model_builder.torch_dtype(self.engine.dtype)


def build_model(spec: WorkerSpec, groups: RankGroups) -> Any:
    """This rank's shards, built as rank 0 builds its own (runtime/model_builder.py)."""
    model = model_builder.build_model(spec.engine, groups.device, groups.tp, spec.config)
    model_builder.install_backend(model, spec.engine.attention_backend, spec.engine.tokens_per_block)
    return model


def serve(spec: WorkerSpec, groups: RankGroups) -> None:
    """Build the model (and draft), then run every step rank 0 announces until it sends STOP."""
    model = build_model(spec, groups)
    rank = RankState(model, groups, spec)
    while True:
        op, fields = recv_header(groups.control)
        if op is Op.STOP:
            return
        rank.handle(op, fields)


class RankState:
    """What a worker holds between messages: its shards, KV pools, draft and capture buffer."""

    def __init__(self, model: Any, groups: RankGroups, spec: WorkerSpec) -> None:
        self.model, self.groups, self.engine = model, groups, spec.engine
        self.spec, self.draft = model_builder.build_speculation(model, spec.engine)  # (None, None) without a draft
        self.kv: Any = None
        self.draft_kv: Any = None
        self.capture: Any = None

    @torch.inference_mode()
    def handle(self, op: Op, fields: list[int]) -> None:
        g, m = self.groups, self.model
        if op is Op.ALLOC:
            self.kv = None  # free the old pool first
            self.kv = KVCache(m.cfg, fields[0], fields[1], KV_DTYPES[fields[2]], m.dtype, g.device, m.tp)
        elif op is Op.ALLOC_DRAFT:
            self._alloc_draft(fields)
        elif op is Op.PROFILE:
            _profile(m, fields, g)
        elif op is Op.STEP:
            x, captured = receive_forward(g.control, g.tp, fields, g.device)
            target_logits(m, self._kv(), x, self.capture if captured else None)  # rank 0 samples
        elif op is Op.DRAFT:
            self._draft(fields)

    def _kv(self) -> KVCache:
        if self.kv is None:
            raise RuntimeError("rank 0 sent a step before the KV cache was allocated (protocol bug)")
        return self.kv

    def _alloc_draft(self, fields: list[int]) -> None:
        from m3bench.runtime.speculative.setup import draft_store, spec_capture

        m = self.model
        self.draft_kv = draft_store(self.draft, fields[0], fields[1], KV_DTYPES[fields[2]], m.dtype, self.groups.device)
        self.capture = spec_capture(m, self.spec, self.draft, self.engine.max_batch_size, self.engine.max_num_tokens)

    def _draft(self, fields: list[int]) -> None:
        g = self.groups
        d = receive_draft(g.control, g.tp, fields, g.device)
        n = len(d.ends_host)
        run_draft(self.draft, self.draft_kv, self.capture.buffer, d, self.spec.draft_len,
                  lambda logits: (receive_picks(g.tp, n, g.device), None))  # rank 0 picks


def _profile(model: Any, fields: list[int], groups: RankGroups) -> None:
    from m3bench.runtime.block_manager import blocks_for_budget

    tokens, P, code, page_bytes, ppm = fields[:5]
    model_builder.profile_forward(model, tokens, P, KV_DTYPES[code])
    agree_min(groups.control, blocks_for_budget(page_bytes, groups.device, ppm / 1e6))


def agree_min(control: Any, value: int) -> int:
    """The smallest `value` over all ranks (every rank calls it at the same point)."""
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=control)
    return int(t.item())


def spawned_main(rank: int, world: int, init_method: str, spec: WorkerSpec, run_dir: str, parent_pid: int,
                 serve_fn: Any = None) -> None:
    """Entry point of a spawned worker: errors go to run_dir/worker<rank>.err and exit code 1. `serve_fn(spec,
    groups)` is the rank's work (default `serve`; attention DP: distributed/attention_dp.serve_rank)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle; it then stops us
    _watch_parent(parent_pid, run_dir)
    try:
        device = rank_device(spec.device, rank)
        Path(run_dir, f"worker{rank}.ready").touch()  # rank 0 joins the rendezvous once every worker got here
        groups = init_groups(rank, world, init_method, device)
        (serve_fn or serve)(spec, groups)
        destroy_groups(groups)
    except BaseException:  # noqa: BLE001 - any failure must reach rank 0 as a message, then exit
        text = traceback.format_exc()
        Path(run_dir, f"worker{rank}.err").write_text(text)
        sys.stderr.write(f"m3bench tensor-parallel worker {rank} failed:\n{text}")
        sys.stderr.flush()
        _exit_after_parent(parent_pid, run_dir, PARENT_POLL_S * 2)


def _watch_parent(parent_pid: int, run_dir: str) -> None:
    """Exit when rank 0's process is gone (killed without a chance to stop us): no orphans."""
    threading.Thread(target=_exit_after_parent, args=(parent_pid, run_dir, float("inf")),
                     name="m3bench-parent-watch", daemon=True).start()


def _exit_after_parent(parent_pid: int, run_dir: str, wait_s: float) -> None:
    """Exit 1 once rank 0 is gone (at most wait_s from now); a gone rank 0 leaves its run directory to us."""
    deadline = time.monotonic() + wait_s
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(PARENT_POLL_S)
    if os.getppid() != parent_pid:
        shutil.rmtree(run_dir, ignore_errors=True)
    os._exit(1)
