"""The step's inputs as rows, built on the host and copied to the device once (every mode of the loop).

    rows = StepRows()
    for seq, n in zip(batch.seqs, batch.num_tokens):
        rows.add(seq, n, drafts)            # drafts: () for a plain row, K ids (or PLACEHOLDERs) to verify
    inputs = rows.to_device(batch, bm, device, K, row_tokens=state.tokens, draft_tokens=fn)

A decode row runs 1 token, a verify row 1 + K (the last token, then the K drafts), a prefill row a chunk,
a scoring row a chunk whose logprobs are kept. Logits rows, in order: every verify row's 1 + K, the last
token of each plain generating row (sampled), then the scored tokens. A token still on the device is a
PLACEHOLDER on the host: the last token of a row (overlap: taken from `row_tokens`, the DecodeState's
per-row tokens) or a verify row's drafts (taken from `draft_tokens(verify_rows)`). The slot of every
token is looked up on the device from the persistent block table (no page ids cross the bus).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.decode_state import PLACEHOLDER
from m3bench.runtime.scheduler import ScheduledBatch
from m3bench.runtime.sequence import Sequence
from m3bench.runtime.transfer import upload


@dataclass(frozen=True)
class Row:
    """One request in the step."""

    seq: Sequence
    start: int  # num_computed before the step
    length: int  # tokens run (1 + K for a verify row)
    base: int  # index of its first token among the step's tokens
    drafts: tuple[int, ...]  # the drafts it verifies (empty: not a verify row)


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttnMetadata
    logits_idx: torch.Tensor  # [N] token indices whose logits are needed: verify, sampled, then score rows
    sample_seqs: list[Sequence]  # the plain rows' requests (sampled by the engine's sampler), in order
    score_targets: torch.Tensor  # [N - len(sample_seqs) - (1 + K) len(verify)] the token each score row predicts
    score_counts: list[tuple[Sequence, int]]  # score rows per scoring request, in order
    device_built: bool = False  # a decode step built from the DecodeState (rows 0..B-1, one token each)
    sample_rows: torch.Tensor | None = None  # host-built: block-table row of each sampled request
    sample_pos: torch.Tensor | None = None  # host-built: the position its sampled token will take
    sample_pos_host: list[int] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)  # host-built: every row, in batch order
    verify: list[Row] = dataclasses.field(default_factory=list)  # the verify rows
    plain: list[Row] = dataclasses.field(default_factory=list)  # the plain generating rows (sample_seqs')
    draft_tokens: torch.Tensor | None = None  # [len(verify), K] on the device


class StepRows:
    """Host lists of one step, filled request by request."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.pos: list[int] = []
        self.table_rows: list[int] = []
        self.starts, self.seq_lens, self.q_lens = [0], [], []
        self.verify_idx, self.plain_idx, self.score_idx, self.targets, self.drafts = [], [], [], [], []
        self.draft_idx: list[int] = []  # token indices of the verify rows' drafts
        self.ph_idx: list[int] = []  # token indices of rows' last tokens still on the device
        self.ph_rows: list[int] = []  # their block-table rows
        self.sample_rows: list[int] = []
        self.sample_pos: list[int] = []
        self.rows: list[Row] = []
        self.verify: list[Row] = []
        self.plain: list[Row] = []
        self.counts: list[tuple[Sequence, int]] = []

    def add(self, seq: Sequence, n: int, drafts: tuple[int, ...] | list[int] = ()) -> None:
        start, base = seq.num_computed, len(self.ids)
        chunk = seq.token_slice(start, start + n) + list(drafts)
        row = Row(seq, start, len(chunk), base, tuple(drafts))
        self.ids += chunk
        self.pos += range(start, start + len(chunk))
        self.table_rows += [seq.row] * len(chunk)
        self.seq_lens.append(start + len(chunk))
        self.q_lens.append(len(chunk))
        self.starts.append(len(self.ids))
        self.rows.append(row)
        self._score(seq, start, start + n, base)
        if not seq.is_score and start + n == seq.num_tokens:
            self._sample(row)
        if chunk[n - 1] == PLACEHOLDER:  # its token is still on the device (overlap)
            self.ph_idx.append(base + n - 1)
            self.ph_rows.append(seq.row)

    def _sample(self, row: Row) -> None:
        if row.drafts:
            self.verify.append(row)
            self.verify_idx += range(row.base, row.base + row.length)
            self.drafts += row.drafts
            self.draft_idx += range(row.base + 1, row.base + row.length)
        else:
            self.plain.append(row)
            self.plain_idx.append(row.base + row.length - 1)
            self.sample_rows.append(row.seq.row)
            self.sample_pos.append(row.start + row.length)

    def _score(self, seq: Sequence, start: int, end: int, base: int) -> None:
        """Scored prompt tokens of the chunk (scoring requests, prompt logprobs)."""
        lo, hi = max(start, seq.logprob_from - 1), min(end, len(seq.prompt_ids) - 1)
        if seq.is_score or (seq.logprob_from >= 0 and hi > lo):
            self.score_idx += range(base + lo - start, base + hi - start)
            self.targets += seq.token_slice(lo + 1, hi + 1)
            self.counts.append((seq, max(hi - lo, 0)))

    def to_device(self, batch: ScheduledBatch, bm: BlockManager, device: torch.device, K: int = 0,
                  row_tokens: torch.Tensor | None = None,
                  draft_tokens: Callable[[list[Row]], torch.Tensor] | None = None) -> StepInputs:
        """One host -> device copy; PLACEHOLDERs filled on the device (`row_tokens` [rows]: the last token
        of each block-table row; `draft_tokens(verify)`: [len(verify), K], else the host's drafts)."""
        T, B = len(self.ids), len(self.seq_lens)
        idx = self.verify_idx + self.plain_idx + self.score_idx
        parts = [self.ids, self.pos, self.table_rows, self.starts, self.seq_lens, idx, self.targets, self.drafts,
                 self.draft_idx, self.ph_idx, self.ph_rows, self.sample_rows, self.sample_pos]
        dev = upload(torch.tensor([v for p in parts for v in p], dtype=torch.int64), device)
        ids, pos, trows, qsl, lens, lidx, tgt, drafts, draft_idx, ph_idx, ph_rows, s_rows, s_pos = dev.split(
            [len(p) for p in parts])
        if self.ph_idx:
            ids[ph_idx] = row_tokens[ph_rows]
        if self.verify and draft_tokens is not None:
            drafts = draft_tokens(self.verify).reshape(-1)
            ids[draft_idx] = drafts
        bm.flush()
        P = bm.P
        slots = bm.table[trows, pos // P].long() * P + pos % P
        meta = AttnMetadata(query_start_loc=qsl.int(), seq_lens=lens.int(),
                            block_tables=bm.rows_view(batch.seqs, -(-max(self.seq_lens) // P)), slot_mapping=slots,
                            positions=pos, query_lens_host=self.q_lens, seq_lens_host=self.seq_lens)
        return StepInputs(ids, pos, meta, lidx, [r.seq for r in self.plain], tgt, self.counts, False, s_rows, s_pos,
                          self.sample_pos, self.rows, self.verify, self.plain, drafts.view(-1, K) if K else None)
