"""Greedy verification on hand-made cases; rejection sampling preserves the target distribution."""

from __future__ import annotations

import torch

from m3bench.runtime.speculative.propose import sample_draft
from m3bench.runtime.speculative.verify import draw_uniforms, verify_greedy, verify_sampled

V = 6


def _logits_with_argmax(tops: list[list[int]]) -> torch.Tensor:
    """[B, K+1, V] random logits whose argmax at [b, t] is tops[b][t]."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(tops), len(tops[0]), V, generator=g)
    for b, row in enumerate(tops):
        for t, tok in enumerate(row):
            x[b, t, tok] = x[b, t].max() + 1.0
    return x


def test_greedy_hand_cases():
    tops = [[1, 2, 3, 4],   # drafts 1 2 3: all accepted, bonus 4
            [1, 2, 3, 4],   # drafts 1 5 3: first accepted, correction 2 at position 1
            [0, 2, 3, 4],   # drafts 1 2 3: first rejected (a later match does not count)
            [1, 2, 3, 4],   # 2 real drafts 1 2 (third is padding): both accepted, bonus 3
            [5, 2, 3, 4]]   # no draft: the target's own token
    drafts = torch.tensor([[1, 2, 3], [1, 5, 3], [1, 2, 3], [1, 2, 0], [0, 0, 0]])
    res = verify_greedy(_logits_with_argmax(tops), drafts, torch.tensor([3, 3, 3, 2, 0]))
    assert res.num_accepted.tolist() == [3, 1, 0, 2, 0]
    assert res.num_emitted.tolist() == [4, 2, 1, 3, 1]
    assert res.output_tokens.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [0, -1, -1, -1], [1, 2, 3, -1],
                                          [5, -1, -1, -1]]


def test_greedy_rows_of_sampled_verification_are_exact():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 4, V, generator=g)
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(4, 3, V, generator=g), -1)
    drafts = logits[:, :3].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % V  # row 1 rejects at position 1
    nd = torch.tensor([3, 3, 2, 1])
    want = verify_greedy(logits, drafts, nd)
    for seed in range(5):
        u = torch.rand(4, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        got = verify_sampled(p, q, drafts, nd, torch.ones(4, dtype=torch.bool), u)
        assert torch.equal(got.output_tokens, want.output_tokens)
        assert torch.equal(got.num_accepted, want.num_accepted)


# chi-square critical values at a false-alarm rate of 1e-4 per test (scipy.stats.chi2.ppf(1 - 1e-4, df));
# 13 tests below: an overall false-alarm rate <= 1.3e-3 (and the seed is fixed, so the run is deterministic)
CHI2_CRIT = {5: 25.745}


def _chi2(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=V).double()
    expected = probs.double() * samples.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def _tables(g: torch.Generator, sharp: float) -> torch.Tensor:
    return torch.softmax(sharp * torch.randn(V, V, generator=g, dtype=torch.float64), -1)


def test_rejection_sampling_preserves_the_target_distribution():
    """Chain of K = 2 drafts over a prefix-dependent toy model: p(.|prev) and q(.|prev) tables.

    The emitted first token must follow p(.|c); the second, given the first was an accepted draft a,
    p(.|a); the third, given the second was an accepted draft b, p(.|b)."""
    g = torch.Generator().manual_seed(0)
    p0, q0 = _tables(g, 1.0)[0], _tables(g, 1.0)[0]
    P, Q = _tables(g, 1.5), _tables(g, 1.5)  # [prev, next]
    n = 120_000
    x0 = torch.multinomial(q0.expand(n, V), 1, generator=g).squeeze(1)
    x1 = torch.multinomial(Q[x0], 1, generator=g).squeeze(1)
    target = torch.stack((p0.expand(n, V), P[x0], P[x1]), dim=1)
    draft = torch.stack((q0.expand(n, V), Q[x0]), dim=1)
    u = torch.rand(n, 3, generator=g, dtype=torch.float64)
    no_greedy = torch.zeros(n, dtype=torch.bool)
    res = verify_sampled(target, draft, torch.stack((x0, x1), 1), torch.full((n,), 2), no_greedy, u)
    y, acc = res.output_tokens, res.num_accepted
    assert _chi2(y[:, 0], p0) < CHI2_CRIT[5]
    assert _chi2(y[:, 0], q0) > 10 * CHI2_CRIT[5]  # the test has power: the draft's own q is rejected
    for a in range(V):
        assert _chi2(y[(acc >= 1) & (y[:, 0] == a), 1], P[a]) < CHI2_CRIT[5]
        assert _chi2(y[(acc >= 2) & (y[:, 1] == a), 2], P[a]) < CHI2_CRIT[5]
    # acceptance of the first draft happens with probability sum_x min(p0, q0)
    rate = float((acc >= 1).double().mean())
    assert abs(rate - float(torch.minimum(p0, q0).sum())) < 4 * (0.25 / n) ** 0.5 + 1e-9


def test_per_request_generators_make_rows_independent_of_the_batch():
    g = torch.Generator().manual_seed(3)
    target = torch.softmax(torch.randn(3, 4, V, generator=g), -1)
    logits = torch.randn(3, V, generator=g)
    nd = [3, 1, 2]

    def run(rows: list[int]) -> torch.Tensor:
        gens = [torch.Generator().manual_seed(100 + r) for r in rows]
        s = sample_draft(logits[rows], [0.8] * len(rows), gens, torch.Generator().manual_seed(7))
        drafts = s.token_ids[:, None].expand(-1, 3)  # the same token at every position: fine for the check
        q = s.probs[:, None].expand(-1, 3, -1)
        u = draw_uniforms([nd[r] for r in rows], 3, gens, torch.Generator().manual_seed(7), "cpu")
        return verify_sampled(target[rows], q, drafts, torch.tensor([nd[r] for r in rows]),
                              torch.zeros(len(rows), dtype=torch.bool), u).output_tokens

    batch = run([0, 1, 2])
    assert torch.equal(run([1])[0], batch[1]) and torch.equal(run([2, 0])[0], batch[2])


def test_sample_draft_greedy_rows_are_one_hot_and_sampled_rows_follow_q():
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(4))
    s = sample_draft(logits, [0.0, 1.0], [None, None], torch.Generator().manual_seed(5))
    assert int(s.token_ids[0]) == int(logits[0].argmax()) and float(s.probs[0].max()) == 1.0
    assert torch.allclose(s.probs[1], torch.softmax(logits[1], -1))
    n = 60_000
    big = logits[1:].expand(n, V)
    draws = sample_draft(big, [1.0] * n, [None] * n, torch.Generator().manual_seed(6)).token_ids
    assert _chi2(draws, torch.softmax(logits[1], -1)) < CHI2_CRIT[5]


def test_target_distribution_matches_the_samplers_filtering():
    from m3bench.runtime.sampler import top_k_top_p
    from m3bench.runtime.sequence import SamplingParams
    from m3bench.runtime.speculative.verify import target_distribution

    logits = torch.randn(2, 3, V, generator=torch.Generator().manual_seed(8))
    params = [SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=0.0)]
    p = target_distribution(logits, params)
    assert torch.allclose(p[0], torch.softmax(top_k_top_p(logits[0] / 0.7, [3] * 3, [1.0] * 3), -1))
    assert torch.allclose(p[1], torch.softmax(logits[1], -1))
    assert int((p[0] > 0).sum(-1).max()) == 3
