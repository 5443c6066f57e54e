"""Sampler: greedy, seeds, top-k / top-p support and distribution, logprobs."""

import pytest
import torch

from m3bench.runtime.sampler import Sampler, make_generator, top_k_top_p
from m3bench.runtime.sequence import SamplingParams

V = 8
N_DRAWS = 4000


def _logits(seed=0, rows=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 1.5


def _draw(logits_row, params, n=N_DRAWS, seed=1):
    """n independent draws from one row (the rows of one batch share the sampler's stream)."""
    s = Sampler("cpu", seed=seed)
    out = s(logits_row.expand(n, V).contiguous(), [params] * n, [None] * n)
    return out.token_ids


def _reference(logits_row, k, p, temp):
    """Renormalized target distribution in float64, written from the definitions."""
    x = logits_row.double() / temp
    order = x.argsort(descending=True)
    probs = torch.softmax(x, -1)
    keep = torch.zeros(V, dtype=torch.bool)
    mass = 0.0
    for rank, t in enumerate(order.tolist()):
        if (k and rank >= k) or (rank > 0 and mass >= p):
            break
        keep[t] = True
        mass += probs[t].item()
    q = torch.where(keep, probs, torch.zeros_like(probs))
    return q / q.sum(), keep


# chi-square critical value for df <= 7 at alpha = 1e-4 (per test a false alarm 1 in 10,000 runs)
CHI2_CRIT_1E4 = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}


@pytest.mark.parametrize("k,p,temp", [(0, 1.0, 1.0), (3, 1.0, 1.0), (0, 0.7, 1.0), (5, 0.8, 0.7), (0, 1.0, 2.0)])
def test_samples_follow_the_renormalized_distribution(k, p, temp):
    row = _logits(seed=k + 10)[0]
    tokens = _draw(row, SamplingParams(temperature=temp, top_k=k, top_p=p))
    q, keep = _reference(row, k, p, temp)
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts[~keep].sum() == 0, "a token outside top-k / top-p was emitted"
    expected = q[keep] * N_DRAWS
    chi2 = ((counts[keep] - expected) ** 2 / expected).sum().item()
    df = int(keep.sum()) - 1
    if df > 0:
        assert chi2 < CHI2_CRIT_1E4[df], f"chi2 {chi2:.1f} over {df} dof"


def test_top_k_top_p_masks_in_place_of_original_order():
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.0, 1.0]])
    y = top_k_top_p(x, [2, 0], [1.0, 0.5])
    assert torch.isinf(y[0]).tolist() == [True, False, True, False]
    assert torch.isinf(y[1]).tolist() == [False, True, True, True]  # 0.5 nucleus keeps the top token only


def test_greedy_is_argmax():
    x = _logits(rows=5)
    out = Sampler("cpu")(x, [SamplingParams()] * 5, [None] * 5)
    assert out.token_ids.tolist() == x.argmax(-1).tolist() and out.logprobs is None


def test_seeded_rows_do_not_depend_on_batch():
    x = _logits(seed=3, rows=4)
    p, other = SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=1.0)
    cpu = torch.device("cpu")
    alone = [Sampler("cpu", seed=0)(x[1:2], [p], [make_generator(7, cpu)]).token_ids.item() for _ in range(1)]
    for batch_seed in (1, 2, 3):
        out = Sampler("cpu", seed=batch_seed)(x, [other, p, other, other], [None, make_generator(7, cpu), None, None])
        assert out.token_ids[1].item() == alone[0]


def test_seeded_stream_reproduces_over_steps():
    x = _logits(seed=4)
    p = SamplingParams(temperature=1.0, seed=11)

    def stream():
        g = make_generator(11, torch.device("cpu"))
        s = Sampler("cpu", seed=0)
        return [s(x, [p], [g]).token_ids.item() for _ in range(30)]

    a, b = stream(), stream()
    assert a == b and len(set(a)) > 1


def test_logprobs_chosen_and_top_n():
    x = _logits(seed=5, rows=3)
    params = [SamplingParams(logprobs=2), SamplingParams(temperature=1.0, logprobs=0), SamplingParams()]
    out = Sampler("cpu")(x, params, [None] * 3)
    ref = torch.log_softmax(x.double(), -1)
    for i in range(3):
        assert out.logprobs[i].item() == pytest.approx(ref[i, out.token_ids[i]].item(), abs=1e-5)
    top = ref.topk(2, -1)
    assert out.top_ids.tolist() == top.indices.tolist()
    assert torch.allclose(out.top_logprobs.double(), top.values, atol=1e-5)


def test_banned_tokens_never_emitted():
    x = _logits(seed=6, rows=2)
    top = x.argmax(-1).tolist()
    out = Sampler("cpu")(x, [SamplingParams(), SamplingParams(temperature=1.0)], [None, None],
                         banned=[[top[0]], [top[1]]])
    assert out.token_ids[0].item() != top[0] and out.token_ids[1].item() != top[1]
