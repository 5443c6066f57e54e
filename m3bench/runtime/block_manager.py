"""The KV page pool: allocate / free / append pages, per-request block tables, prefix caching.

A page holds `tokens_per_block` tokens of every layer (one id, one lifetime). Each running request
owns one row of a persistent device table `table[max_rows, max_pages]`; new pages are appended as
entries (batched into one device write per step by `flush`), rows are never rebuilt. When a request
leaves, the last used row moves into its place, so rows 0..B-1 stay dense and a step that schedules
every running request reads `table[:B]` as a view.

Prefix caching: a full, computed page is hashed by (parent hash, its token ids) and kept when its
last user leaves (ref count 0) in an LRU of evictable pages; a later request with the same prefix
takes it back instead of recomputing it.

    bm = BlockManager(num_blocks=64, tokens_per_block=128, max_rows=8, max_pages=16, device="cpu")
    bm.admit(seq, reusable_tokens=len(seq.prompt_ids) - 1)   # prefix-cache hits
    bm.allocate(seq, seq.num_computed + chunk) or preempt_someone()
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.sequence import Sequence
from m3bench.runtime.transfer import upload_list


@dataclass
class Page:
    page_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class PrefixStats:
    queried_tokens: int = 0  # prompt tokens looked up at admission
    hit_tokens: int = 0  # of those, found in the cache

    @property
    def hit_rate(self) -> float:
        if self.queried_tokens == 0:
            raise ValueError("no prefix-cache lookups yet")
        return self.hit_tokens / self.queried_tokens


def page_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """Hash of a full page: its tokens and (through `parent`) every token before it."""
    return hashlib.blake2b(parent + array("i", token_ids).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, tokens_per_block: int, max_rows: int, max_pages: int,
                 device: torch.device | str = "cpu", enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or tokens_per_block <= 0:
            raise InputError(f"need a positive pool, got {num_blocks} pages of {tokens_per_block} tokens")
        self.P = tokens_per_block
        self.num_blocks = num_blocks
        self.caching = enable_prefix_caching
        self.pages = [Page(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached pages nobody uses, oldest first
        self.cached: dict[bytes, int] = {}  # page hash -> page id
        self.table = torch.zeros(max_rows, max_pages, dtype=torch.int32, device=device)
        self.max_pages = max_pages
        self.row_owner: list[Sequence] = []  # row r belongs to row_owner[r]
        self.max_rows = max_rows
        self.pending: list[tuple[int, int, int]] = []  # (row, column, page) writes not yet on the device
        self.stats = PrefixStats()
        self.on_free: list = []  # callables(seq) run when a request's pages go (speculation drops its draft state)
        self.on_move: list = []  # callables(src_row, dst_row) run when a row's contents move to fill a hole

    @property
    def num_available(self) -> int:
        """Pages that an allocation can take now (free plus evictable cached)."""
        return len(self.free_ids) + len(self.evictable)

    def pages_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(-(-num_tokens // self.P) - len(seq.block_ids), 0)

    def admit(self, seq: Sequence, reusable_tokens: int) -> None:
        """Give `seq` a table row and its cached prefix (whole pages, at most `reusable_tokens` tokens)."""
        assert seq.row < 0 and not seq.block_ids, "admit a request that holds nothing"
        self._take_row(seq)
        hits = self._match(seq, reusable_tokens) if self.caching else []
        for pid in hits:
            self._ref(pid)
            self._append(seq, pid)
        seq.num_computed = seq.num_cached = len(hits) * self.P
        self.stats.queried_tokens += len(seq.prompt_ids)
        self.stats.hit_tokens += seq.num_cached

    def unadmit(self, seq: Sequence) -> None:
        """Undo `admit` for a request that could not get its first pages (it stays queued)."""
        self.stats.queried_tokens -= len(seq.prompt_ids)
        self.stats.hit_tokens -= seq.num_cached
        self.free(seq)

    def _match(self, seq: Sequence, reusable_tokens: int) -> list[int]:
        hits, parent = [], b""
        for i in range(min(reusable_tokens // self.P, self.max_pages)):
            ids = seq.token_slice(i * self.P, (i + 1) * self.P)
            h = page_hash(parent, ids)
            pid = self.cached.get(h)
            if pid is None or self.pages[pid].token_ids != tuple(ids):
                break
            hits.append(pid)
            seq.page_hashes.append(h)
            parent = h
        return hits

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Make `seq` hold pages for its first `num_tokens` tokens; False (nothing taken) if the pool is short."""
        need = self.pages_needed(seq, num_tokens)
        if need > self.num_available or len(seq.block_ids) + need > self.max_pages:
            return False
        for _ in range(need):
            pid = self._take_page()
            self._ref(pid)
            self._append(seq, pid)
        return True

    def commit(self, seq: Sequence) -> None:
        """After a step: register the pages that have become full and computed in the prefix cache."""
        if not self.caching:
            return
        ids_needed = seq.num_computed // self.P
        while len(seq.page_hashes) < ids_needed:
            i = len(seq.page_hashes)
            ids = seq.token_slice(i * self.P, (i + 1) * self.P)
            h = page_hash(seq.page_hashes[-1] if seq.page_hashes else b"", ids)
            seq.page_hashes.append(h)
            page = self.pages[seq.block_ids[i]]
            if h not in self.cached and page.hash is None:  # a twin computed elsewhere keeps the entry
                page.hash, page.token_ids = h, tuple(ids)
                self.cached[h] = page.page_id

    def free(self, seq: Sequence) -> None:
        """Release every page of `seq` (tail first, so the LRU evicts tails before shared heads) and its row."""
        for pid in reversed(seq.block_ids):
            page = self.pages[pid]
            page.ref_count -= 1
            if page.ref_count == 0:
                if page.hash is not None:
                    self.evictable[pid] = None
                else:
                    self.free_ids.append(pid)
        seq.block_ids, seq.page_hashes, seq.num_computed = [], [], 0  # num_cached: kept, a fact of the last admission
        for hook in self.on_free:
            hook(seq)
        if seq.row >= 0:
            self._release_row(seq)

    def flush(self) -> None:
        """Write the block-table entries appended since the last flush to the device, in one copy."""
        if not self.pending:
            return
        rows, cols, vals = upload_list(self.pending, torch.int64, self.table.device).T
        self.table[rows, cols] = vals.to(self.table.dtype)
        self.pending.clear()

    def rows_view(self, seqs: list[Sequence], num_pages: int) -> torch.Tensor:
        """Block tables of `seqs` [B, num_pages]: a view when they are rows 0..B-1 in order."""
        rows = [s.row for s in seqs]
        if rows == list(range(len(rows))):
            return self.table[: len(rows), :num_pages]
        idx = upload_list(rows, torch.int64, self.table.device)
        return self.table.index_select(0, idx)[:, :num_pages]

    def _append(self, seq: Sequence, pid: int) -> None:
        self.pending.append((seq.row, len(seq.block_ids), pid))
        seq.block_ids.append(pid)

    def _ref(self, pid: int) -> None:
        page = self.pages[pid]
        if page.ref_count == 0:
            self.evictable.pop(pid, None)
        page.ref_count += 1

    def _take_page(self) -> int:
        if self.free_ids:
            return self.free_ids.popleft()
        pid, _ = self.evictable.popitem(last=False)
        page = self.pages[pid]
        del self.cached[page.hash]
        page.hash, page.token_ids = None, ()
        return pid

    def _take_row(self, seq: Sequence) -> None:
        if len(self.row_owner) >= self.max_rows:
            raise RuntimeError("more running requests than block-table rows (scheduler bug)")
        seq.row = len(self.row_owner)
        self.row_owner.append(seq)

    def _release_row(self, seq: Sequence) -> None:
        self.pending = [w for w in self.pending if w[0] != seq.row]  # a freed row's writes must not land
        last = self.row_owner.pop()
        if last is not seq:  # move the last row into the hole: rows stay dense
            self.flush()
            self.table[seq.row].copy_(self.table[last.row])
            for hook in self.on_move:
                hook(last.row, seq.row)
            self.row_owner[seq.row] = last
            last.row = seq.row
        seq.row = -1


def blocks_for_budget(bytes_per_page: int, device: torch.device, utilization: float) -> int:
    """Pages that fit in `utilization` of the device's memory beside what is already allocated (CUDA only)."""
    if device.type != "cuda":
        raise InputError("a memory-budget pool size needs a CUDA device; pass num_kv_blocks on CPU")
    if not 0.0 < utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    free_b, total_b = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    peak_b, current_b = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    used_b = total_b - free_b  # everything resident now (this process and others)
    budget_b = total_b * utilization - used_b - (peak_b - current_b)  # keep the activation peak free
    n = int(budget_b // bytes_per_page)
    if n <= 0:
        raise InputError(f"no room for KV pages: {budget_b / 2**30:.2f} GiB left at utilization {utilization}")
    return n
