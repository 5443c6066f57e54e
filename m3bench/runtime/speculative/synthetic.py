"""Synthetic acceptance: force the accepted-draft count per step so throughput is measured at a fixed AL.

    synth = SyntheticAcceptance(acceptance_length=2.7, seed=0, device="cuda")
    forced = synth.draw(num_draft)                                          # [B] int64
    res = force_acceptance(draft_tokens, target_tokens, forced)             # instead of verify_*

With m = AL - 1 accepted tokens wanted per step, each step draws floor(m) + Bernoulli(m - floor(m))
from one seeded generator: the mean is exactly m and the spread the smallest possible (two
neighbouring counts). The count is then clipped to the row's own draft count, so rows proposing
fewer than ceil(m) tokens pull the mean below m (with every row at draft_len it is exact, since
SpecConfig keeps AL in [1, 1 + draft_len]). The emitted tokens are the forced draft prefix plus
the target's own token at the next position: they are not the model's output, and the stats of
such a run carry `synthetic=True`.
"""

from __future__ import annotations

import math

import torch

from m3bench.runtime.speculative.verify import VerifyResult, assemble_result


class SyntheticAcceptance:
    def __init__(self, acceptance_length: float, seed: int, device: torch.device | str = "cpu"):
        if acceptance_length < 1.0:
            raise ValueError(f"synthetic acceptance length must be >= 1, got {acceptance_length}")
        m = acceptance_length - 1.0
        self.base, self.frac = math.floor(m), m - math.floor(m)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.device = torch.device(device)

    def draw(self, num_draft: torch.Tensor) -> torch.Tensor:
        """[B] forced accepted counts for rows proposing num_draft [B] tokens."""
        u = torch.rand(num_draft.shape[0], generator=self.generator, device=self.device)
        n = self.base + (u < self.frac).long()
        return torch.minimum(n.to(num_draft.device), num_draft.long())


def force_acceptance(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, forced: torch.Tensor) -> VerifyResult:
    """Accept the first forced[b] drafts of row b, then emit target_tokens[b, forced[b]] ([B, K+1] picks)."""
    k = draft_tokens.shape[1]
    accepted = torch.arange(k, device=draft_tokens.device)[None, :] < forced[:, None]
    return assemble_result(draft_tokens, accepted, target_tokens.long().gather(1, forced[:, None].long()).squeeze(1))
