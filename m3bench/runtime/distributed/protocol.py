"""Control messages from rank 0 to the other ranks: a fixed int64 header on the gloo control group,
then, for a step, the host lengths (gloo) and one packed int64 payload on the model group (NCCL on
GPU, so the step's tensors never leave the device on rank 0).

    send_header(control, Op.ALLOC, (num_pages, P, kv_code))
    op, fields = recv_header(control)
    send_forward(control, tp, inputs, captured)        # rank 0: a target forward's inputs
    x, captured = receive_forward(control, tp, fields, device)   # other ranks: rank_step.ForwardInputs
    send_draft(control, tp, d) / receive_draft(...)    # the draft phase's inputs (draft_step.DraftInputs)
    send_picks(tp, tokens) / receive_picks(tp, n, device)   # one chain step's draft tokens
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.parallel import TPGroup
from m3bench.runtime.rank_step import ForwardInputs
from m3bench.runtime.speculative.draft_step import DraftInputs

HEADER_LEN = 8
KV_DTYPES = tuple(KVDtype)  # header code i means KV_DTYPES[i]


class Op(IntEnum):
    STEP = 1  # fields: T, B, N, width, captured; then host lengths and the payload (a target forward)
    PROFILE = 2  # fields: tokens, P, kv code, page bytes, utilization in ppm; then all ranks agree on a minimum
    ALLOC = 3  # fields: num_pages, P, kv code
    STOP = 4
    ALLOC_DRAFT = 5  # fields: num_pages, page size, kv code (the Eagle3 draft layer's pool)
    DRAFT = 6  # fields: t, b, p, width; then host lengths, the payload, and (p > 0) K picks of p draft tokens


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


def send_forward(control: Any, tp: TPGroup, x: Any, captured: bool) -> None:
    """Rank 0: the target forward it is about to run (x: StepInputs)."""
    meta = x.meta
    T, B, N, tables = x.input_ids.shape[0], meta.num_seqs, x.logits_idx.shape[0], meta.block_tables
    send_header(control, Op.STEP, (T, B, N, tables.shape[1], int(captured)))
    broadcast0(torch.tensor(meta.query_lens_host + meta.seq_lens_host, dtype=torch.int64), control)
    parts = (x.input_ids, meta.positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens, tables.flatten(),
             x.logits_idx)
    broadcast0(torch.cat([p.to(torch.int64) for p in parts]), tp.group)


def receive_forward(control: Any, tp: TPGroup, fields: list[int], device: torch.device
                    ) -> tuple[ForwardInputs, bool]:
    """Other ranks: the forward announced by a STEP header with these fields, and whether it captures."""
    T, B, N, width, captured = fields[:5]
    lens = _receive_host(control, 2 * B)
    sizes = [T, T, T, B + 1, B, B * width, N]
    ids, pos, slots, qsl, seq_lens, tables, idx = _receive_payload(tp, sizes, device).split(sizes)
    meta = AttnMetadata(query_start_loc=qsl.int(), seq_lens=seq_lens.int(), block_tables=tables.view(B, width).int(),
                        slot_mapping=slots, positions=pos, query_lens_host=lens[:B], seq_lens_host=lens[B:])
    return ForwardInputs(ids, pos, meta, idx), bool(captured)


def send_draft(control: Any, tp: TPGroup, d: DraftInputs) -> None:
    """Rank 0: the draft phase it is about to run."""
    sizes = d.sizes()
    send_header(control, Op.DRAFT, (sizes[0], sizes[5], sizes[6], d.tables.shape[1]))
    broadcast0(torch.tensor(d.q_lens + d.lens_host + d.ends_host, dtype=torch.int64), control)
    parts = [d.tok, d.pos, d.trow, d.feat, d.qsl, d.lens, d.last, d.ends, d.prow, d.tables.flatten()]
    broadcast0(torch.cat([p.to(torch.int64) for p in parts]), tp.group)


def receive_draft(control: Any, tp: TPGroup, fields: list[int], device: torch.device) -> DraftInputs:
    """Other ranks: the draft phase announced by a DRAFT header with these fields."""
    t, b, p, width = fields[:4]
    host = _receive_host(control, 2 * b + p)
    sizes = [t, t, t, t, b + 1, b, p, p, p]
    flat, tables = _receive_payload(tp, sizes + [b * width], device).split([sum(sizes), b * width])
    return DraftInputs.from_flat(flat, sizes, tables.view(b, width).int(), host[:b], host[b:2 * b], host[2 * b:])


def send_picks(tp: TPGroup, tokens: torch.Tensor) -> None:
    broadcast0(tokens.contiguous(), tp.group)


def receive_picks(tp: TPGroup, n: int, device: torch.device) -> torch.Tensor:
    return _receive_payload(tp, [n], device)


def _receive_host(control: Any, n: int) -> list[int]:
    host = torch.zeros(n, dtype=torch.int64)
    broadcast0(host, control)
    return host.tolist()


def _receive_payload(tp: TPGroup, sizes: list[int], device: torch.device) -> torch.Tensor:
    payload = torch.empty(sum(sizes), dtype=torch.int64, device=device)
    broadcast0(payload, tp.group)
    return payload


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
