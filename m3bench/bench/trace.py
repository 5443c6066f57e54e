"""Request traces in the Mooncake / AIPerf `mooncake_trace` format, replayed as benchmark prompts.

    spec = TraceSpec(Path("conversation_trace.jsonl"), offset=0, max_requests=64, scale=1 / 32)
    reqs = spec.window()                                 # scaled TraceRequests, in trace order
    prompts = trace_prompts(tokenizer, reqs, spec.block_tokens, seed=0)
    arrivals_s = spec.arrivals_s(reqs)                   # --schedule timestamps (None: trace order behind the cap)

Each line is `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`; the
ids name the prompt's 512-token blocks (equal ids = identical block), the last block may be
partial. Prompts are rebuilt so that equal ids give identical token blocks: each id's block is a
fixed run of random ordinary token ids drawn from a generator seeded by (seed, salt, id), a partial
block is a prefix of it. The trace's prefix-sharing pattern is kept exactly.

`--trace-scale F` multiplies the block size (512 F must be a whole number of tokens) and every
length: a request of k blocks keeps k blocks, its last block's length is scaled and rounded (1..B),
its output length rounded (>= 1). Timestamps are not scaled (`--time-scale` does that).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from m3bench.bench.workload import Tokenizer, WorkloadPrompt, json_object_line, plain_vocab
from m3bench.numbers import is_finite_number, is_int
from m3bench.runtime.errors import InputError

TRACE_BLOCK_TOKENS = 512
TRACE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceSchedule(str, Enum):
    CONCURRENCY = "concurrency"  # trace order, all at once behind the concurrency cap
    TIMESTAMPS = "timestamps"  # each request sent at its timestamp (times --time-scale), the cap still held


@dataclass(frozen=True)
class TraceRequest:
    line: int  # 1-based line number in the file
    timestamp_ms: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class TraceSpec:
    path: Path
    offset: int = 0  # requests skipped at the start of the file
    max_requests: int | None = None  # None: every request after the offset
    scale: float = 1.0  # --trace-scale: block size and lengths times this
    schedule: TraceSchedule = TraceSchedule.CONCURRENCY
    time_scale: float = 1.0  # --time-scale: arrival offsets times this (0.5 = twice as fast)

    def check(self) -> None:
        if self.offset < 0 or (self.max_requests is not None and self.max_requests < 1):
            raise InputError(f"trace window: need offset >= 0 and max requests >= 1, got {self.offset}, "
                             f"{self.max_requests}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise InputError(f"--time-scale must be > 0, got {self.time_scale}")
        self.block_tokens  # noqa: B018 - validates the scale
        if not self.window():
            raise InputError(f"{self.path}: no request at offset {self.offset} (the trace has "
                             f"{len(read_trace(self.path))})")

    @property
    def block_tokens(self) -> int:
        """Tokens per block after scaling (512 F, a whole number)."""
        b = TRACE_BLOCK_TOKENS * self.scale
        if not (math.isfinite(b) and b >= 1 and abs(b - round(b)) < 1e-9):
            raise InputError(f"--trace-scale {self.scale}: 512 x F must be a whole number of tokens >= 1 "
                             f"(e.g. 1/4, 1/32, 1/512)")
        return int(round(b))

    def window(self) -> list[TraceRequest]:
        """The replayed requests, scaled, in trace order."""
        rows = read_trace(self.path)
        end = None if self.max_requests is None else self.offset + self.max_requests
        return [scale_request(r, self.block_tokens) for r in rows[self.offset:end]]

    def arrivals_s(self, reqs: Sequence[TraceRequest]) -> list[float] | None:
        """Send offsets (s) from the first request's timestamp, or None when replayed by the cap alone."""
        if self.schedule is TraceSchedule.CONCURRENCY or not reqs:
            return None
        t0 = reqs[0].timestamp_ms
        return [(r.timestamp_ms - t0) / 1000.0 * self.time_scale for r in reqs]

    def digest(self) -> str:
        """sha256 of the trace file (part of a sweep point's fingerprint)."""
        return _file_digest(Path(self.path), *_stamp(Path(self.path)))


def scale_request(r: TraceRequest, block_tokens: int) -> TraceRequest:
    """The request with blocks of `block_tokens`: same block count, last block and output scaled."""
    if block_tokens == TRACE_BLOCK_TOKENS:
        return r
    f = block_tokens / TRACE_BLOCK_TOKENS
    last = r.input_len - TRACE_BLOCK_TOKENS * (len(r.hash_ids) - 1)
    last_scaled = min(block_tokens, max(1, round(last * f)))
    return replace(r, input_len=block_tokens * (len(r.hash_ids) - 1) + last_scaled,
                   output_len=max(1, round(r.output_len * f)))


# ---- reading and checking ------------------------------------------------------------------------


def read_trace(path: Path) -> list[TraceRequest]:
    """Every request of a trace file; InputError naming the line of the first bad one."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--dataset trace: no such file: {path}")
    return list(_read_cached(path, *_stamp(path)))


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=4)
def _read_cached(path: Path, mtime_ns: int, size: int) -> tuple[TraceRequest, ...]:
    out: list[TraceRequest] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                req = parse_trace_line(line, n, path)
                if out and req.timestamp_ms < out[-1].timestamp_ms:
                    raise InputError(f"{path}:{n}: timestamp {req.timestamp_ms} is before the previous line's "
                                     f"{out[-1].timestamp_ms} (a trace must be sorted by time)")
                out.append(req)
    if not out:
        raise InputError(f"{path}: no requests")
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _file_digest(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_trace_line(line: str, n: int, path: Path) -> TraceRequest:
    """One line as a TraceRequest, every field checked (InputError `path:n: ...`)."""
    row = json_object_line(line, path, n)
    missing = [k for k in TRACE_KEYS if k not in row]
    if missing:
        raise InputError(f"{path}:{n}: missing key(s) {', '.join(missing)}")
    ts, n_in, n_out, ids = (row[k] for k in TRACE_KEYS)
    if not is_finite_number(ts) or ts < 0:
        raise InputError(f"{path}:{n}: timestamp must be a number of ms >= 0, got {ts!r}")
    for key, value, low in (("input_length", n_in, 1), ("output_length", n_out, 1)):
        if not is_int(value) or value < low:
            raise InputError(f"{path}:{n}: {key} must be an integer >= {low}, got {value!r}")
    _check_hash_ids(ids, n_in, path, n)
    return TraceRequest(n, float(ts), int(n_in), int(n_out), tuple(int(i) for i in ids))


def _check_hash_ids(ids: Any, n_in: int, path: Path, n: int) -> None:
    if not isinstance(ids, list) or not all(is_int(i) for i in ids):
        raise InputError(f"{path}:{n}: hash_ids must be a list of integers")
    need = -(-n_in // TRACE_BLOCK_TOKENS)
    if len(ids) != need:
        what = "too short" if len(ids) < need else "too long"
        raise InputError(f"{path}:{n}: hash_ids {what} for input_length {n_in}: {len(ids)} ids, "
                         f"{need} blocks of {TRACE_BLOCK_TOKENS} tokens")


# ---- prompts -------------------------------------------------------------------------------------


class BlockTokens:
    """Deterministic token ids per hash id: block `i` is the same run of ids wherever it appears."""

    def __init__(self, vocab: np.ndarray, block_tokens: int, seed: int = 0, salt: int = 0) -> None:
        self.vocab, self.block_tokens, self.seed, self.salt = vocab, block_tokens, seed, salt
        self._cache: dict[int, np.ndarray] = {}

    def block(self, hash_id: int) -> np.ndarray:
        got = self._cache.get(hash_id)
        if got is None:
            rng = np.random.default_rng([abs(self.seed), self.salt, hash_id & (2**63 - 1), int(hash_id < 0)])
            got = self.vocab[rng.integers(0, len(self.vocab), size=self.block_tokens)]
            self._cache[hash_id] = got
        return got

    def prompt(self, r: TraceRequest) -> list[int]:
        """The request's `input_len` ids: its blocks in order, the last one cut to length."""
        last = r.input_len - self.block_tokens * (len(r.hash_ids) - 1)
        parts = [self.block(i) for i in r.hash_ids[:-1]] + [self.block(r.hash_ids[-1])[:last]]
        return np.concatenate(parts).tolist()


def trace_prompts(tokenizer: Tokenizer, reqs: Sequence[TraceRequest], block_tokens: int, seed: int = 0,
                  salt: int = 0, with_text: bool = True) -> list[WorkloadPrompt]:
    """One prompt per request (token ids of exact length; text decoded from them when `with_text`)."""
    blocks = BlockTokens(plain_vocab(tokenizer), block_tokens, seed, salt)
    ids = [blocks.prompt(r) for r in reqs]
    texts = tokenizer.batch_decode(ids) if with_text and ids else [""] * len(ids)
    return [WorkloadPrompt(tuple(i), t, r.output_len) for i, t, r in zip(ids, texts, reqs)]


def fits(r: TraceRequest, max_model_len: int | None) -> bool:
    """Whether prompt and output fit the engine's context (None: unknown, assumed to fit)."""
    return max_model_len is None or r.input_len + r.output_len <= max_model_len
