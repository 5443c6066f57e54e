"""Decode inputs kept on the device: per block-table row, the last sampled token and its position.

A row holds its request's state once a step has sampled a token for it (`record` after a step built
on the host, `advance` after a device-built one); moves of rows (block_manager `on_move`) move the
state with them, freed rows forget it. A step in which every scheduled request decodes one token from
its own row 0..B-1 is then built on the device (`inputs`): the tokens and positions are views of the
persistent tensors, slots come from the block table; the host sends nothing but new block-table
entries (BlockManager.flush). `pos_host` mirrors the positions (the host knows lengths, not tokens).

    state = DecodeState(bm, device)
    if state.ready(batch): ids, pos, slots, seq_lens, seq_lens_host = state.inputs(len(batch.seqs))

Under speculation (`draft_len` K > 0, the SpecRunner's own state) a row also holds the K drafts its next
verify checks: an early-drafted step (SpecRunner.draft_early) records each verify row's next last token
(the bonus), its position and the drafts, all on the device, and the next pure-verify step is built from
them (`verify_inputs`); a step built on the host forgets its rows (`forget_rows`), whose state moved on.
"""

from __future__ import annotations

import operator

import torch

from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.scheduler import ScheduledBatch
from m3bench.runtime.transfer import upload_list

PLACEHOLDER = -1  # a token id still being sampled on the device (asynchronous scheduling)


class DecodeState:
    def __init__(self, bm: BlockManager, device: torch.device, draft_len: int = 0) -> None:
        rows = bm.max_rows
        self.bm, self.P, self.K = bm, bm.P, draft_len
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # next input token of each row
        self.pos = torch.zeros(rows, dtype=torch.int64, device=device)  # its position
        self.pos_host = torch.zeros(rows, dtype=torch.int64)
        self.drafts = torch.zeros(rows, draft_len, dtype=torch.int64, device=device)  # speculation: next drafts
        q = draft_len + 1
        self._offsets = torch.arange(q, dtype=torch.int64, device=device)  # a verify row's positions past its start
        self._row_of_token = torch.arange(rows, dtype=torch.int64, device=device).repeat_interleave(q)
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

    def verify_inputs(self, B: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Speculation: (input ids, positions, slot mapping [B (K + 1)], seq lens int32 [B], drafts [B, K]) of
        rows 0..B-1, each verifying its drafts: [last token, d_1..d_K] at positions L..L + K."""
        q = self.K + 1
        pos = (self.pos[:B, None] + self._offsets).reshape(-1)
        ids = torch.cat((self.tokens[:B, None], self.drafts[:B]), dim=1).reshape(-1)
        pages = self.bm.table[self._row_of_token[:B * q], pos // self.P].long()
        return ids, pos, pages * self.P + pos % self.P, (self.pos[:B] + q).int(), self.drafts[:B]

    def record_verified(self, seqs: list, start: torch.Tensor, last: torch.Tensor, drafts: torch.Tensor) -> None:
        """Speculation, after an early draft: `seqs` (verify rows) next verify `drafts` [B, K] after token
        `last` [B] at position `start` [B] (= their length once the step lands)."""
        rows_host = [s.row for s in seqs]
        if rows_host == list(range(len(seqs))):
            B = len(seqs)
            self.tokens[:B].copy_(last)
            self.pos[:B].copy_(start)
            self.drafts[:B].copy_(drafts)
        else:
            rows = upload_list(rows_host, torch.int64, self.tokens.device)
            self.tokens[rows], self.pos[rows], self.drafts[rows] = last, start, drafts
        for r, s in zip(rows_host, seqs):
            self.owner[r] = s

    def forget_rows(self, seqs: list) -> None:
        """The rows of `seqs` no longer hold their state (a host-built step moved them on)."""
        for s in seqs:
            self._forget(s)

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
        self.drafts[dst:dst + 1].copy_(self.drafts[src:src + 1])
        self.pos_host[dst] = self.pos_host[src]
        self.owner[dst], self.owner[src] = self.owner[src], None
