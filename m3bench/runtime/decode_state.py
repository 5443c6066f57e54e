"""Decode inputs kept on the device: per block-table row, the last sampled token and its position.

A row holds its request's state once a step has sampled a token for it (`record` after a step built
on the host, `advance` after a device-built one); moves of rows (block_manager `on_move`) move the
state with them, freed rows forget it. A step in which every scheduled request decodes one token from
its own row 0..B-1 is then built on the device (`inputs`): the tokens and positions are views of the
persistent tensors, slots come from the block table; the host sends nothing but new block-table
entries (BlockManager.flush). `pos_host` mirrors the positions (the host knows lengths, not tokens).

    state = DecodeState(bm, device)
    if state.ready(batch): ids, pos, slots, seq_lens, seq_lens_host = state.inputs(len(batch.seqs))
"""

from __future__ import annotations

import operator

import torch

from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.scheduler import ScheduledBatch

PLACEHOLDER = -1  # a token id still being sampled on the device (asynchronous scheduling)


class DecodeState:
    def __init__(self, bm: BlockManager, device: torch.device) -> None:
        rows = bm.max_rows
        self.bm, self.P = bm, bm.P
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # next input token of each row
        self.pos = torch.zeros(rows, dtype=torch.int64, device=device)  # its position
        self.pos_host = torch.zeros(rows, dtype=torch.int64)
        self.owner: list = [None] * rows  # owner[r] is seq: row r holds seq's current state (seq.row == r)
        bm.on_free.append(self._forget)
        bm.on_move.append(self._move)

    def ready(self, batch: ScheduledBatch) -> bool:
        """Every request decodes one token and its row 0..B-1 holds its state (no per-request Python)."""
        B = len(batch.seqs)
        return batch.num_tokens.count(1) == B and all(map(operator.is_, self.owner[:B], batch.seqs))

    def inputs(self, B: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """(input ids, positions, slot mapping, seq lens int32, host seq lens) of rows 0..B-1."""
        pos = self.pos[:B]
        pages = self.bm.table[:B].gather(1, (pos // self.P)[:, None])[:, 0].long()
        slots = pages * self.P + pos % self.P
        return self.tokens[:B], pos, slots, (pos + 1).int(), (self.pos_host[:B] + 1).tolist()

    def advance(self, B: int, sampled: torch.Tensor) -> None:
        """After a device-built step: each row's next input is its sampled token, one position on."""
        self.tokens[:B].copy_(sampled)
        self.pos[:B] += 1
        self.pos_host[:B] += 1

    def record(self, seqs: list, rows: torch.Tensor, positions: torch.Tensor, positions_host: list[int],
               sampled: torch.Tensor) -> None:
        """After a host-built step: `seqs` sampled `sampled` for position `positions` in rows `rows`."""
        self.tokens[rows] = sampled
        self.pos[rows] = positions
        rows_host = [s.row for s in seqs]
        self.pos_host[rows_host] = torch.tensor(positions_host, dtype=torch.int64)
        for r, s in zip(rows_host, seqs):
            self.owner[r] = s

    def _forget(self, seq) -> None:
        if seq.row >= 0 and self.owner[seq.row] is seq:
            self.owner[seq.row] = None

    def _move(self, src: int, dst: int) -> None:
        self.tokens[dst:dst + 1].copy_(self.tokens[src:src + 1])
        self.pos[dst:dst + 1].copy_(self.pos[src:src + 1])
        self.pos_host[dst] = self.pos_host[src]
        self.owner[dst], self.owner[src] = self.owner[src], None
