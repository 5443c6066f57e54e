"""Synthetic acceptance hits the requested mean acceptance length and emits the forced prefix."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.speculative.stats import AcceptanceRecord, compute_spec_stats
from m3bench.runtime.speculative.synthetic import SyntheticAcceptance, force_acceptance


@pytest.mark.parametrize("al", [1.0, 1.35, 2.7, 3.528, 4.0])
def test_mean_acceptance_length(al):
    """20,000 steps of batch 8 at draft_len 3: the draw is floor(m) + Bernoulli(frac m), whose standard
    deviation is <= 0.5, so the mean of 160,000 draws has SE <= 0.00125; tolerance 0.01 (8 SE)."""
    synth = SyntheticAcceptance(al, seed=0)
    rec = AcceptanceRecord()
    nd = torch.full((8,), 3)
    for _ in range(20_000):
        for n in synth.draw(nd).tolist():
            assert 0 <= n <= 3 and n in (int(al - 1), int(al - 1) + 1)
            rec.add(proposed=3, accepted=n)
    s = compute_spec_stats([rec], max_draft_len=3, synthetic=True)
    assert s.synthetic and abs(s.acceptance_length - al) < 0.01


def test_reproducible_and_clipped_to_the_row_draft_count():
    a = SyntheticAcceptance(3.5, seed=7).draw(torch.tensor([3, 3, 1, 0]))
    b = SyntheticAcceptance(3.5, seed=7).draw(torch.tensor([3, 3, 1, 0]))
    assert torch.equal(a, b) and a[2] <= 1 and a[3] == 0
    with pytest.raises(ValueError):
        SyntheticAcceptance(0.5, seed=0)


def test_force_acceptance_emits_the_forced_prefix_and_the_target_token():
    drafts = torch.tensor([[7, 8, 9], [7, 8, 9], [7, 8, 9]])
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    res = force_acceptance(drafts, target, torch.tensor([0, 2, 3]))
    assert res.num_accepted.tolist() == [0, 2, 3]
    assert res.output_tokens.tolist() == [[1, -1, -1, -1], [7, 8, 3, -1], [7, 8, 9, 4]]
