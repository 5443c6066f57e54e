"""The one small protocol every evaluation backend implements.

All requests of a run are handed over at once (the engine batches them); each result is reported
through `on_done(index, result)` as soon as it completes, so the runner can append it to disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence


@dataclass(frozen=True)
class GenRequest:
    """One generation: exactly one of `prompt` (raw text) or `messages` (chat turns) is set."""

    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class GenResult:
    text: str
    finish_reason: str  # "stop" (EOS / stop string) or "length" (hit max_tokens)
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    spec: dict[str, Any] = field(default_factory=dict)  # per-request acceptance counters, when speculation ran


@dataclass(frozen=True)
class ScoreRequest:
    """log P(continuation | context), tokenized as context + continuation (lm-eval's split)."""

    context: str
    continuation: str


@dataclass(frozen=True)
class ScoreResult:
    logprob: float
    is_greedy: bool


GenCallback = Callable[[int, GenResult], None]
ScoreCallback = Callable[[int, ScoreResult], None]


class Backend(Protocol):
    name: str

    def generate(self, requests: Sequence[GenRequest], on_done: GenCallback) -> None: ...

    def score(self, requests: Sequence[ScoreRequest], on_done: ScoreCallback) -> None: ...

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> str: ...

    def tokenize(self, text: str) -> list[int]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
