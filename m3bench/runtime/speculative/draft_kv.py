"""The two draft-KV layouts behind one small interface: where the draft layer's K/V pages live.

    layout = SharedDraftKV(store, block_manager)          # or SeparateDraftKV(store, num_pages, device)
    layout.reserve(seq, num_tokens)                        # pages for the draft's first num_tokens positions
    tables = layout.tables(seqs, max_len)                  # [B, pages] int32 block tables on the device
    slots = draft_slots(tables, row_of_token, positions, layout.page_size)   # on the device
    layout.release(seq)                                    # the target request left (finished / preempted)

SHARED: the draft layer is one more layer of the target's pool (`DraftKV` with the target's page
count and page size): page n of the draft belongs to whoever owns target page n, the scheduler's
look-ahead reservation covers the draft's positions, and the block tables are views of the target's
persistent device table: no per-request host work at all.
SEPARATE: the draft's own pool and page size (32 by default, as TensorRT-LLM runs it) with its own
free list; each step the host rebuilds the draft block tables from per-request page lists (the
per-request host cost the shared layout removes). Its lifetime is the target request's: pages are
returned when the target's pages are (the block manager's on_free hook).
"""

from __future__ import annotations

from collections import deque

import torch

from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.sequence import Sequence
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.transfer import upload_list


def draft_slots(tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """Slot page * P + offset of each token, looked up on the device: tables [B, W], rows/positions [T]."""
    return tables[rows, positions // page_size].long() * page_size + positions % page_size


class SharedDraftKV:
    def __init__(self, store: DraftKV, bm: BlockManager) -> None:
        if store.page_size != bm.P or store.num_pages < bm.num_blocks:
            raise ValueError("a shared draft KV needs the target's page size and at least its page count")
        self.store, self.bm, self.page_size = store, bm, bm.P

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        """Nothing to do: the scheduler reserved target pages (hence draft pages) for the look-ahead."""
        if -(-num_tokens // self.page_size) > len(seq.block_ids):
            raise RuntimeError(f"request {seq.request_id}: draft positions beyond its reserved pages (engine bug)")

    def tables(self, seqs: list[Sequence], max_len: int) -> torch.Tensor:
        self.bm.flush()
        return self.bm.rows_view(seqs, -(-max_len // self.page_size))

    def release(self, seq: Sequence) -> None:
        return None


class SeparateDraftKV:
    def __init__(self, store: DraftKV, device: torch.device, reserved: int = 0) -> None:
        """`reserved`: the store's last pages are no request's (the CUDA graphs' scratch page)."""
        self.store, self.page_size, self.device = store, store.page_size, device
        self.free: deque[int] = deque(range(store.num_pages - reserved))
        self.owned: dict[int, list[int]] = {}  # request id -> draft page ids

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        pages = self.owned.setdefault(seq.request_id, [])
        need = -(-num_tokens // self.page_size) - len(pages)
        if need > len(self.free):
            raise RuntimeError(f"draft KV pool exhausted ({self.store.num_pages} pages of {self.page_size})")
        pages.extend(self.free.popleft() for _ in range(max(need, 0)))

    def tables(self, seqs: list[Sequence], max_len: int) -> torch.Tensor:
        width = -(-max_len // self.page_size)
        rows = [(self.owned[s.request_id] + [0] * width)[:width] for s in seqs]
        return upload_list(rows, torch.int32, self.device)

    def release(self, seq: Sequence) -> None:
        self.free.extend(self.owned.pop(seq.request_id, ()))

    @property
    def num_free(self) -> int:
        return len(self.free)
