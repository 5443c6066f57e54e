"""What every protocol provides: items to run (requests + gold) and a judge of each item's outputs.

A protocol is a pure description: it never talks to a backend. Its `version` goes into every record
and into the run key, so a changed prompt or extraction never resumes an old run.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from m3bench.evals.backends.base import GenRequest, GenResult, ScoreRequest, ScoreResult
from m3bench.evals.datasets import DatasetName, Split
from m3bench.evals.references import ProtocolSpec


class RequestKind(str, Enum):
    GENERATE = "generate"
    SCORE = "score"


@dataclass(frozen=True)
class Settings:
    """What the user asked for; None = the protocol's default."""

    num_fewshot: int | None = None
    limit: int | None = None
    max_tokens: int | None = None
    seed: int = 0  # the --limit shuffle


@dataclass(frozen=True)
class Item:
    id: str  # "<split>/<index in the normalized split>"
    requests: tuple[GenRequest, ...] | tuple[ScoreRequest, ...]
    gold: str  # MMLU: the gold letter; GSM8K: the full gold solution
    group: str | None = None  # MMLU subject


@dataclass(frozen=True)
class Judgement:
    value: float  # the item's contribution to the protocol score, 0..1
    extracted: str  # the answer the primary extraction found
    correct: dict[str, bool] = field(default_factory=dict)  # per reported metric
    cap_hit: bool = False  # generation stopped at max_tokens
    extracted_by_metric: dict[str, str] = field(default_factory=dict)  # when metrics extract differently


class Protocol(ABC):
    name: str
    version: str
    dataset: DatasetName
    kind: RequestKind
    metrics: tuple[str, ...]
    default_fewshot: int
    fewshot_split: str
    chat: bool = False  # prompts are chat turns rendered with the checkpoint's template
    default_max_tokens: int | None = None  # generation cap (None: loglikelihood scoring, no generation)

    def fewshot(self, settings: Settings) -> int:
        return self.default_fewshot if settings.num_fewshot is None else settings.num_fewshot

    def max_tokens(self, settings: Settings) -> int | None:
        if self.kind is RequestKind.SCORE:
            return None
        return settings.max_tokens or self.default_max_tokens

    def measured_with(self, settings: Settings) -> ProtocolSpec:
        """The protocol a run with these settings follows, in the reference files' terms."""
        return ProtocolSpec(self.name, self.version, self.fewshot(settings), self.chat, self.max_tokens(settings))

    def splits_needed(self, settings: Settings) -> tuple[str, ...]:
        return ("test", self.fewshot_split) if self.fewshot(settings) > 0 else ("test",)

    @abstractmethod
    def build_items(self, splits: dict[str, Split], settings: Settings) -> list[Item]:
        """Every item the settings select, in a fixed order."""

    @abstractmethod
    def judge(self, item: Item, outputs: Sequence[GenResult] | Sequence[ScoreResult]) -> Judgement:
        """Extraction and verdict of one item from its outputs (one per request)."""

    def describe(self, settings: Settings) -> dict:
        return {"protocol": self.name, "version": self.version, "num_fewshot": self.fewshot(settings)}


def shuffled_prefix(indices: Sequence[int], limit: int | None, seed: int) -> list[int]:
    """The first `limit` of a seeded shuffle (all, in order, when limit is None)."""
    if limit is None:
        return list(indices)
    return random.Random(seed).sample(list(indices), len(indices))[:limit]


def stratified_prefix(groups: Sequence[str], limit: int | None, seed: int) -> list[int]:
    """The first `limit` rows of a seeded shuffle stratified by group (subject sizes kept in proportion).

    Each group is shuffled on its own; row r of a group of size s gets the rank (r + 0.5) / s, and rows are
    taken in rank order, so any prefix holds each group in proportion to its size.
    """
    if limit is None:
        return list(range(len(groups)))
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    ranked = []
    for g, rows in sorted(by_group.items()):
        order = random.Random(f"{seed}/{g}").sample(rows, len(rows))
        ranked.extend(((r + 0.5) / len(order), g, idx) for r, idx in enumerate(order))
    return [idx for _, _, idx in sorted(ranked)[:limit]]
