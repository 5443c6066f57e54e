"""Request state: what one request asked for, what it has produced and where its KV lives.

    seq = Sequence(request_id=0, prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=8), arrival_s=time.time())
    seq.all_ids        # prompt + output; tokens [0, num_computed) have K/V in the cache
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from m3bench.runtime.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    """What the user asked for one request (temperature 0 is greedy; top_k 0 and top_p 1 disable)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; 0: the chosen token's; n: plus the top n
    min_tokens: int = 0
    detokenize: bool = True  # False: token ids only, text stays "" (benchmarks; ids the tokenizer lacks are fine)
    prompt_logprobs: int | None = None  # None: none; n: each prompt token's (after the first) logprob plus the top n

    def __post_init__(self) -> None:
        for name in ("stop", "stop_token_ids"):  # accept lists and a lone string
            v = getattr(self, name)
            object.__setattr__(self, name, (v,) if isinstance(v, (str, int)) else tuple(v))
        self._check()

    def _check(self) -> None:
        if self.max_tokens < 0 or self.min_tokens < 0 or self.min_tokens > max(self.max_tokens, 0):
            raise InputError(f"need 0 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.stop and not self.detokenize:
            raise InputError("stop strings need detokenize=True")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SeqStatus(Enum):
    WAITING = "waiting"  # queued, or preempted (its pages freed; recomputed on re-admission)
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(Enum):
    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # max_tokens, the model's context length or the whole KV pool
    ABORT = "abort"


@dataclass
class Timings:
    """Host wall-clock timestamps (time.time() seconds) of one request."""

    arrival_s: float
    scheduled_s: float | None = None  # first time it was given a step
    token_s: list[float] = field(default_factory=list)  # one per generated token; token_s[0] is the first

    @property
    def first_token_s(self) -> float | None:
        return self.token_s[0] if self.token_s else None


@dataclass
class Sequence:
    """One request. `score_from` >= 0 marks a scoring request: prefill only, logprobs of tokens from there."""

    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float = field(default_factory=time.time)
    score_from: int = -1
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed: int = 0  # tokens whose K/V is in the cache
    num_cached: int = 0  # of those, reused from the prefix cache at the last admission
    block_ids: list[int] = field(default_factory=list)  # host mirror of this request's block-table row
    page_hashes: list[bytes] = field(default_factory=list)  # hashes of its full, computed pages
    row: int = -1  # its row in the device block table, -1 when it holds none
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    score_logprobs: list[float] = field(default_factory=list)
    score_greedy: list[bool] = field(default_factory=list)
    score_top: list[list[tuple[int, float]]] = field(default_factory=list)  # with prompt_logprobs n > 0: top n
    prompt_logprobs_sent: bool = False  # a delta has carried them
    text: str = ""
    num_emitted_chars: int = 0  # of `text`, already streamed
    generator: Any = None  # torch.Generator of a seeded request (created by the sampler)
    detok: "Detokenizer | None" = None
    timings: Timings = field(init=False)

    def __post_init__(self) -> None:
        self.timings = Timings(arrival_s=self.arrival_s)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_to_compute(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_score(self) -> bool:
        return self.score_from >= 0

    @property
    def logprob_from(self) -> int:
        """First prompt position whose logprob is computed on the prefill (-1: none)."""
        if self.is_score:
            return self.score_from
        return 1 if self.params.prompt_logprobs is not None else -1

    @property
    def prompt_logprobs_done(self) -> bool:
        return len(self.score_logprobs) >= len(self.prompt_ids) - self.logprob_from

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def token_slice(self, start: int, stop: int) -> list[int]:
        """all_ids[start:stop] without building the whole list."""
        n = len(self.prompt_ids)
        if stop <= n:
            return self.prompt_ids[start:stop]
        return self.prompt_ids[start:] + self.output_ids[max(start - n, 0): stop - n]


class Detokenizer:
    """Incremental detokenization: only the last few tokens are decoded each step.

    Text is emitted once it no longer ends in an incomplete UTF-8 sequence ("\ufffd"), the way vLLM
    does it: decode(ids[prefix:]) minus decode(ids[prefix:read]) is the new text.
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-6:])  # a little context so leading spaces decode right
        self.prefix = 0
        self.read = len(self.ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prev = self._decode(self.ids[self.prefix:self.read])
        full = self._decode(self.ids[self.prefix:])
        if len(full) > len(prev) and not full.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return full[len(prev):]
        return ""

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end); call once when the request ends."""
        prev = self._decode(self.ids[self.prefix:self.read])
        full = self._decode(self.ids[self.prefix:])
        self.prefix, self.read = self.read, len(self.ids)
        return full[len(prev):] if len(full) > len(prev) else ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
