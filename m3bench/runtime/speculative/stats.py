"""Speculative-decoding counters and the one function that turns them into figures.

    rec = AcceptanceRecord()                    # per request: one (proposed, accepted) per verify step
    rec.add(proposed=3, accepted=2)
    s = compute_spec_stats([rec, ...], max_draft_len=3)     # per run; or compute_spec_stats([rec])

Definitions (docs/measurement.md, vLLM's): over the verify steps with at least one draft token
("drafts"),
- acceptance rate = accepted / proposed;
- acceptance length AL = 1 + accepted / drafts (the bonus token counted);
- per-position rate k (k = 1..K) = (drafts with >= k accepted) / drafts;
- histogram[n] = drafts with exactly n accepted (n = 0..K).
A sample with no draft is an error, never a 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


class EmptySampleError(ValueError):
    """No verify step carried a draft token: acceptance figures do not exist."""


@dataclass
class AcceptanceRecord:
    """Raw facts of one request: (draft tokens proposed, draft tokens accepted) per verify step."""

    steps: list[tuple[int, int]] = field(default_factory=list)

    def add(self, proposed: int, accepted: int) -> None:
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted {accepted} must be in [0, proposed={proposed}]")
        self.steps.append((proposed, accepted))


@dataclass(frozen=True)
class SpecStats:
    verify_steps: int
    drafts: int  # verify steps with >= 1 draft token
    proposed: int
    accepted: int
    accepted_per_position: tuple[int, ...]  # [k-1]: drafts with >= k accepted, k = 1..K
    histogram: tuple[int, ...]  # [n]: drafts with exactly n accepted, n = 0..K
    acceptance_rate: float
    acceptance_length: float
    per_position_rate: tuple[float, ...]
    synthetic: bool  # acceptance forced (synthetic_acceptance_length): outputs are not the model's

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def compute_spec_stats(records: Sequence[AcceptanceRecord], max_draft_len: int, synthetic: bool = False) -> SpecStats:
    """Figures over every step of `records` (one record: per request; all of a run's: per run)."""
    steps = [s for r in records for s in r.steps]
    drafted = [(p, a) for p, a in steps if p > 0]
    if not drafted:
        raise EmptySampleError("no verify step carried a draft token: no acceptance figures")
    if any(p > max_draft_len for p, _ in drafted):
        raise ValueError(f"a step proposed more than max_draft_len={max_draft_len} tokens")
    drafts, proposed, accepted = len(drafted), sum(p for p, _ in drafted), sum(a for _, a in drafted)
    histogram = tuple(sum(1 for _, a in drafted if a == n) for n in range(max_draft_len + 1))
    per_pos = tuple(sum(1 for _, a in drafted if a >= k) for k in range(1, max_draft_len + 1))
    return SpecStats(
        verify_steps=len(steps), drafts=drafts, proposed=proposed, accepted=accepted,
        accepted_per_position=per_pos, histogram=histogram, acceptance_rate=accepted / proposed,
        acceptance_length=1.0 + accepted / drafts, per_position_rate=tuple(c / drafts for c in per_pos),
        synthetic=synthetic,
    )
