"""The device half of an engine step: what every tensor-parallel rank runs, identically, from rank 0's inputs.

    logits = target_logits(model, kv, inputs, capture)     # inputs: StepInputs on rank 0, ForwardInputs elsewhere
    with runner.link.forward(inputs, captured=True):       # rank 0: the inputs reach the other ranks first
        logits = target_logits(...)

Rank 0 schedules and builds the step's inputs (runtime/step_rows.py, the DecodeState); its runners hand them
to their `link` before running them. At TP 1 the link is `NO_LINK` (nothing is sent); under tensor
parallelism it is rank 0's Driver (runtime/distributed/driver.py), and the other ranks receive the same
inputs and call the same functions (distributed/worker.py). Sampling decisions (the sampler, verification,
the draft chain's picks) are rank 0's: a pick that the other ranks need next goes to them by `link.picks`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata


@dataclass(frozen=True)
class ForwardInputs:
    """The target forward of one step as the other ranks receive it (StepInputs carries the same fields)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttnMetadata
    logits_idx: torch.Tensor  # [N]


def target_logits(model: Any, kv: Any, x: Any, capture: Any = None) -> torch.Tensor:
    """Logits [N, V] float32 of the rows x.logits_idx (every rank joins the model's collectives; with
    `capture` the capture-layer residuals land in its buffer)."""
    hidden = model(x.input_ids, x.positions, x.meta, kv, capture)
    return model.compute_logits(hidden[x.logits_idx])


class StepLink:
    """How rank 0's step inputs reach the other ranks. This base sends nothing (TP 1)."""

    tensor_parallel = False  # whether other ranks run the step too (their draft follows the host's inputs)

    def forward(self, x: Any, captured: bool) -> AbstractContextManager:
        """Around the target forward of x (a StepInputs); `captured`: the step keeps the capture residuals."""
        return nullcontext()

    def draft(self, d: Any) -> AbstractContextManager:
        """Around the draft's extend and chain of d (speculative/draft_step.DraftInputs)."""
        return nullcontext()

    def picks(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rank 0's draft tokens of one chain step, to every rank; returned as they are."""
        return tokens


NO_LINK = StepLink()
