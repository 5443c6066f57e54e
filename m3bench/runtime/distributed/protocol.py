"""Control messages from rank 0 to the other ranks: a fixed int64 header on the gloo control group,
then, for a step, the host lengths (gloo) and one packed int64 payload on the model group (NCCL on
GPU, so the step's tensors never leave the device on rank 0).

    send_header(control, Op.ALLOC, (num_pages, P, kv_code))
    op, fields = recv_header(control)
    broadcast_step(control, tp, inputs)          # rank 0
    step = receive_step(control, tp, fields, device)   # other ranks
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.parallel import TPGroup

HEADER_LEN = 8
KV_DTYPES = tuple(KVDtype)  # header code i means KV_DTYPES[i]


class Op(IntEnum):
    STEP = 1  # fields: T, B, N, width; then host lengths and the payload
    PROFILE = 2  # fields: tokens, P, kv code, page bytes, utilization in ppm; then all ranks agree on a minimum
    ALLOC = 3  # fields: num_pages, P, kv code
    STOP = 4
    ALLOC_DRAFT = 5  # fields: num_pages, page size, kv code (the Eagle3 draft layer's pool)
    CALL = 6  # fields: callee, method, descriptor length (mirror.py)


@dataclass(frozen=True)
class WorkerStep:
    """One step as a worker replays it."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttnMetadata
    logits_idx: torch.Tensor


def send_header(control: Any, op: Op, fields: tuple[int, ...] = ()) -> None:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[0] = int(op)
    header[1:1 + len(fields)] = torch.tensor(fields, dtype=torch.int64)
    broadcast0(header, control)


def recv_header(control: Any) -> tuple[Op, list[int]]:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    broadcast0(header, control)
    values = header.tolist()
    return Op(values[0]), values[1:]


def broadcast_step(control: Any, tp: TPGroup, input_ids: torch.Tensor, meta: AttnMetadata,
                   logits_idx: torch.Tensor) -> None:
    """Rank 0: send the step that rank 0 is about to run."""
    T, B, N = input_ids.shape[0], meta.num_seqs, logits_idx.shape[0]
    tables = meta.block_tables
    send_header(control, Op.STEP, (T, B, N, tables.shape[1]))
    broadcast0(torch.tensor(meta.query_lens_host + meta.seq_lens_host, dtype=torch.int64), control)
    parts = (input_ids, meta.positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens, tables.flatten(),
             logits_idx)
    broadcast0(torch.cat([p.to(torch.int64) for p in parts]), tp.group)


def receive_step(control: Any, tp: TPGroup, fields: list[int], device: torch.device) -> WorkerStep:
    """Other ranks: the step announced by a STEP header with these fields."""
    T, B, N, width = fields[:4]
    host = torch.zeros(2 * B, dtype=torch.int64)
    broadcast0(host, control)
    lens = host.tolist()
    sizes = [T, T, T, B + 1, B, B * width, N]
    payload = torch.empty(sum(sizes), dtype=torch.int64, device=device)
    broadcast0(payload, tp.group)
    ids, pos, slots, qsl, seq_lens, tables, idx = payload.split(sizes)
    meta = AttnMetadata(query_start_loc=qsl.int(), seq_lens=seq_lens.int(), block_tables=tables.view(B, width).int(),
                        slot_mapping=slots, positions=pos, query_lens_host=lens[:B], seq_lens_host=lens[B:])
    return WorkerStep(ids, pos, meta, idx)


def broadcast0(x: torch.Tensor, group: Any) -> None:
    """x from rank 0 to every rank of `group`, in place (a standalone gloo group is a bare Backend,
    unknown to torch.distributed's rank bookkeeping: it is driven directly)."""
    import torch.distributed as dist

    if isinstance(group, dist.ProcessGroup) or group is None:
        dist.broadcast(x, 0, group=group)
    else:
        group.broadcast(x, 0).wait()


def kv_code(kv_dtype: KVDtype) -> int:
    return KV_DTYPES.index(kv_dtype)
