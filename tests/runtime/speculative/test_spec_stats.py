"""Acceptance figures from a hand-made trace equal the hand-computed ones; an empty sample is an error."""

from __future__ import annotations

import pytest

from m3bench.runtime.speculative.stats import AcceptanceRecord, EmptySampleError, compute_spec_stats


def _record(steps):
    r = AcceptanceRecord()
    for p, a in steps:
        r.add(proposed=p, accepted=a)
    return r


def test_hand_made_trace():
    # request A: (3,3) (3,1) (0,0: a step without a draft, e.g. the first decode); request B: (3,0) (2,2)
    a, b = _record([(3, 3), (3, 1), (0, 0)]), _record([(3, 0), (2, 2)])
    s = compute_spec_stats([a, b], max_draft_len=3)
    # drafts 4, proposed 3+3+3+2 = 11, accepted 3+1+0+2 = 6
    assert (s.verify_steps, s.drafts, s.proposed, s.accepted) == (5, 4, 11, 6)
    assert s.acceptance_rate == pytest.approx(6 / 11)
    assert s.acceptance_length == pytest.approx(1 + 6 / 4)
    # accepted >= 1: 3 drafts (3, 1, 2); >= 2: 2 (3, 2); >= 3: 1 (3)
    assert s.accepted_per_position == (3, 2, 1)
    assert s.per_position_rate == pytest.approx((3 / 4, 2 / 4, 1 / 4))
    assert s.histogram == (1, 1, 1, 1)  # one draft each with 0, 1, 2, 3 accepted
    assert sum(s.accepted_per_position) == s.accepted  # the identity sum_k P(acc >= k) = E[acc]
    assert not s.synthetic and s.to_dict()["histogram"] == [1, 1, 1, 1]
    only_a = compute_spec_stats([a], max_draft_len=3)
    assert (only_a.drafts, only_a.accepted, only_a.acceptance_length) == (2, 4, 3.0)


def test_empty_and_bad_samples():
    with pytest.raises(EmptySampleError):
        compute_spec_stats([], max_draft_len=3)
    with pytest.raises(EmptySampleError):
        compute_spec_stats([_record([(0, 0), (0, 0)])], max_draft_len=3)
    with pytest.raises(ValueError, match="accepted"):
        AcceptanceRecord().add(proposed=2, accepted=3)
    with pytest.raises(ValueError, match="max_draft_len"):
        compute_spec_stats([_record([(4, 1)])], max_draft_len=3)
