"""Drawing one draft token per request from the draft's logits, keeping the distribution q it came from.

    s = sample_draft(draft.compute_logits(h), temperatures, generators, fallback)
    ids = draft.to_target_ids(s.token_ids); q = draft.probs_to_target(s.probs)   # for verify_sampled

q = softmax(logits / T) (no top-k / top-p: rejection sampling is exact for any q the token was
drawn from); greedy rows (T = 0) take the argmax with a one-hot q. Sampling is the exponential
race (argmax of q / E, E ~ Exp(1)); a seeded request draws E from its own generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class DraftSample:
    token_ids: torch.Tensor  # [B] int64, draft-vocabulary ids
    probs: torch.Tensor  # [B, Vd] float32, the distribution each token was drawn from


def sample_draft(logits: torch.Tensor, temperatures: Sequence[float], generators: Sequence[torch.Generator | None],
                 fallback: torch.Generator) -> DraftSample:
    """One token per row of float32 logits [B, Vd]."""
    temp = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=logits.device)
    greedy = torch.tensor([t <= 0 for t in temperatures], device=logits.device)
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for b, g in enumerate(generators):
        noise[b].exponential_(generator=g if g is not None else fallback)
    return draw_from_noise(logits, temp, greedy, noise)


def draw_from_noise(logits: torch.Tensor, temp: torch.Tensor, greedy: torch.Tensor, noise: torch.Tensor) -> DraftSample:
    """`sample_draft` with device inputs (graph safe): temperatures [B] (1 for greedy rows), greedy [B]
    bool, and the Exp(1) noise [B, Vd] already drawn."""
    top = logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temp[:, None], dim=-1)
    tokens = torch.where(greedy, top, (probs / noise).argmax(dim=-1))
    one_hot = torch.zeros_like(probs).scatter_(1, top[:, None], 1.0)
    return DraftSample(token_ids=tokens, probs=torch.where(greedy[:, None], one_hot, probs))
