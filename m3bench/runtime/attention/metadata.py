"""AttnMetadata: one per step, shared by every layer (tokens of all sequences flattened, no padding).

A query token at position p attends keys 0..p of its own sequence (a multi-token chunk is a
staircase of per-token causal limits).

    meta = build_attn_metadata(query_lens=[5, 1], seq_lens=[5, 17], page_tables=[[0], [3, 4]],
                               tokens_per_block=16, device="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass
class AttnMetadata:
    query_start_loc: torch.Tensor  # [B+1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [B] int32, context length after this step's tokens are written
    block_tables: torch.Tensor  # [B, max_pages] int32 page ids (rows may be views into a persistent table)
    slot_mapping: torch.Tensor  # [T] int64 page * P + offset where token t's K/V/ik is written
    positions: torch.Tensor  # [T] int64
    query_lens_host: list[int]  # host mirrors, used by the torch path only
    seq_lens_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_host)


def token_positions(query_lens: list[int], seq_lens: list[int]) -> list[int]:
    """Token t of a q_len chunk sits at position seq_len - q_len + t."""
    out: list[int] = []
    for q, s in zip(query_lens, seq_lens):
        out.extend(range(s - q, s))
    return out


def slot_of(page_table: list[int], pos: int, tokens_per_block: int) -> int:
    return page_table[pos // tokens_per_block] * tokens_per_block + pos % tokens_per_block


def build_attn_metadata(query_lens: list[int], seq_lens: list[int], page_tables: list[list[int]],
                        tokens_per_block: int, device: torch.device | str = "cpu") -> AttnMetadata:
    """Metadata for one step: per sequence its new-token count, total length and page ids."""
    _check(query_lens, seq_lens, page_tables, tokens_per_block)
    positions = token_positions(query_lens, seq_lens)
    slots: list[int] = []
    for q, s, table in zip(query_lens, seq_lens, page_tables):
        slots.extend(slot_of(table, p, tokens_per_block) for p in range(s - q, s))
    width = max((len(t) for t in page_tables), default=0) or 1
    tables = torch.zeros((len(page_tables), width), dtype=torch.int32)
    for b, t in enumerate(page_tables):
        tables[b, :len(t)] = torch.tensor(t, dtype=torch.int32)
    starts = torch.tensor([0, *accumulate(query_lens)], dtype=torch.int32)
    return AttnMetadata(
        query_start_loc=starts.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device), slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        query_lens_host=list(query_lens), seq_lens_host=list(seq_lens))


def _check(query_lens: list[int], seq_lens: list[int], page_tables: list[list[int]], p: int) -> None:
    if not len(query_lens) == len(seq_lens) == len(page_tables):
        raise ValueError("query_lens, seq_lens and page_tables must have one entry per sequence")
    for q, s, t in zip(query_lens, seq_lens, page_tables):
        if not 0 < q <= s:
            raise ValueError(f"query length {q} must be in [1, seq_len={s}]")
        if len(t) * p < s:
            raise ValueError(f"{len(t)} pages of {p} tokens cannot hold {s} tokens")
