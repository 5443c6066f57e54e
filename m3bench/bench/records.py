"""Raw facts of a benchmark run: one record per request, the spec-decode counters, the SLO.

Times are `time.perf_counter()` seconds on the client. Statistics are made from these in one
place only: `m3bench.bench.metrics.compute_metrics`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from m3bench.runtime.errors import InputError


@dataclass(frozen=True)
class RequestRecord:
    """What the client saw for one request.

    `chunk_times_s[i]` is when the i-th streamed chunk that carried generated text or tokens
    arrived; `chunk_tokens[i]` its token count (0 when the target does not say, e.g. text only).
    `output_tokens` comes from the response's `usage` when the target reports it, else from
    `sum(chunk_tokens)`. `error` is set (and the record never averaged in) when the request failed.
    """

    send_time_s: float
    chunk_times_s: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    error: str | None = None
    client_busy_s: float = 0.0  # time the client itself spent parsing/recording this request's chunks

    @property
    def ok(self) -> bool:
        return self.error is None and self.output_tokens > 0 and len(self.chunk_times_s) > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "RequestRecord":
        return RequestRecord(
            send_time_s=float(d["send_time_s"]),
            chunk_times_s=tuple(float(t) for t in d["chunk_times_s"]),
            chunk_tokens=tuple(int(n) for n in d["chunk_tokens"]),
            prompt_tokens=int(d["prompt_tokens"]),
            output_tokens=int(d["output_tokens"]),
            error=d.get("error"),
            client_busy_s=float(d.get("client_busy_s", 0.0)),
        )


@dataclass(frozen=True)
class SpecCounters:
    """Speculative-decoding counters over a run (differences of the engine's running totals).

    drafts: verify steps with at least one draft token; draft_tokens: proposed; accepted_tokens:
    accepted; accepted_per_pos[k]: steps whose draft token at position k was accepted.
    """

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: tuple[int, ...] = ()

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        """Counters of the window between `before` and self (both running totals)."""
        width = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad = lambda t: tuple(t) + (0,) * (width - len(t))  # noqa: E731
        per_pos = tuple(a - b for a, b in zip(pad(self.accepted_per_pos), pad(before.accepted_per_pos)))
        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted_tokens - before.accepted_tokens,
            per_pos,
        )


@dataclass(frozen=True)
class PrefixCounters:
    """Prefix-cache counters (tokens): prompt tokens looked up at admission, and of those served from the cache."""

    queried_tokens: int
    hit_tokens: int

    def minus(self, before: "PrefixCounters") -> "PrefixCounters":
        return PrefixCounters(self.queried_tokens - before.queried_tokens, self.hit_tokens - before.hit_tokens)


@dataclass(frozen=True)
class EngineCounters:
    """What a target's metrics say about a run: speculation and prefix-cache counters, and its KV page size
    (each None when the target does not export it)."""

    spec: SpecCounters | None = None
    prefix: PrefixCounters | None = None
    page_tokens: int | None = None


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput (vLLM `--goodput`): a request is good if it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self):
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # nan fails too
                raise InputError(f"--slo-{name.replace('_', '-')} must be a positive number of ms, got {value}")


def write_records(path: Path, records: Iterable[RequestRecord]) -> None:
    """One JSON object a line."""
    with Path(path).open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")


def read_records(path: Path) -> list[RequestRecord]:
    with Path(path).open() as f:
        return [RequestRecord.from_dict(json.loads(line)) for line in f if line.strip()]
