"""Verification of chain drafts on the device, batched: greedy matching and rejection sampling.

    res = verify_greedy(target_logits[B, K+1, V], draft_tokens[B, K], num_draft[B])
    p = target_distribution(target_logits, params)               # [B, K+1, V], as the sampler samples
    u = draw_uniforms(num_draft_host, K, generators, fallback, device)          # [B, K+1]
    res = verify_sampled(p, draft_probs[B, K, V], draft_tokens, num_draft, greedy[B], u)
    res.num_accepted [B], res.output_tokens [B, K+1] (-1 padded), res.num_emitted = num_accepted + 1

Row b carries num_draft[b] <= K draft tokens (padding beyond is ignored); position t of the target
scores the token after draft prefix t (t = 0: after the last verified token). Emitted per row:
the accepted draft prefix, then one more token (correction on a rejection, bonus when all pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from m3bench.runtime.sampler import effective_top_k, top_k_top_p_rows
from m3bench.runtime.sequence import SamplingParams
from m3bench.runtime.transfer import upload_list


@dataclass(frozen=True)
class VerifyResult:
    num_accepted: torch.Tensor  # [B] int64 accepted draft tokens
    output_tokens: torch.Tensor  # [B, K+1] int64: accepted drafts, then the bonus/correction token, then -1

    @property
    def num_emitted(self) -> torch.Tensor:
        return self.num_accepted + 1


def _valid(num_draft: torch.Tensor, k: int) -> torch.Tensor:
    """[B, K] bool: position t holds a real draft token."""
    return torch.arange(k, device=num_draft.device)[None, :] < num_draft[:, None]


def assemble_result(draft_tokens: torch.Tensor, accepted_mask: torch.Tensor, last: torch.Tensor) -> VerifyResult:
    """Accepted prefix mask [B, K] and the final token [B] -> padded outputs."""
    n = accepted_mask.sum(dim=1)
    b, k = draft_tokens.shape
    out = torch.full((b, k + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    out[:, :k] = torch.where(accepted_mask, draft_tokens.long(), out[:, :k])
    out.scatter_(1, n[:, None], last.long()[:, None])
    return VerifyResult(num_accepted=n, output_tokens=out)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor) -> VerifyResult:
    """Accept the longest draft prefix equal to the target's argmax; then emit the argmax after it."""
    top = target_logits.argmax(dim=-1)  # [B, K+1]
    k = draft_tokens.shape[1]
    match = (draft_tokens.long() == top[:, :k]) & _valid(num_draft, k)
    accepted = match.long().cumprod(dim=1).bool()
    last = top.gather(1, accepted.sum(dim=1, keepdim=True)).squeeze(1)
    return assemble_result(draft_tokens, accepted, last)


def target_distribution(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """[B, K+1, V] logits -> the probabilities the sampler draws from: softmax of top-k / top-p
    filtered logits / T, row b with params[b] (T = 0 rows use T = 1: only their argmax matters)."""
    v = logits.shape[-1]
    temp, k, p = (upload_list(values, dtype, logits.device) for values, dtype in zip(sampling_rows(params, v), (
        torch.float32, torch.int64, torch.float32)))
    return target_distribution_rows(logits, temp, k, p, filtered(params))


def sampling_rows(params: Sequence[SamplingParams], vocab: int) -> tuple[list[float], list[int], list[float]]:
    """Per row: temperature (T = 0 rows: 1), top-k (1..vocab; 0 = off -> vocab), top-p."""
    return ([p.temperature if p.temperature > 0 else 1.0 for p in params],
            [effective_top_k(p.top_k, vocab) for p in params], [p.top_p for p in params])


def filtered(params: Sequence[SamplingParams]) -> bool:
    """Whether any row filters by top-k / top-p."""
    return any(p.top_k > 0 or p.top_p < 1.0 for p in params)


def target_distribution_rows(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                             filter_rows: bool) -> torch.Tensor:
    """target_distribution with the rows' temperature, top-k, top-p as device tensors [B] (graph safe)."""
    b, n, v = logits.shape
    x = logits.float() / temp[:, None, None]
    if filter_rows:
        x = top_k_top_p_rows(x.reshape(b * n, v), top_k.repeat_interleave(n), top_p.repeat_interleave(n)).view(b, n, v)
    return torch.softmax(x, dim=-1)


def draw_uniforms(num_draft: Sequence[int], k: int, generators: Sequence[torch.Generator | None],
                  fallback: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """[B, K+1] U[0,1): row b takes num_draft[b] + 1 draws from its own generator (else `fallback`):
    columns [0, num_draft[b]) for the acceptance tests, column K for the final sample.

    A seeded request's draws depend only on its own generator and draft count, not the batch."""
    rows = []
    for n, g in zip(num_draft, generators):
        gen = g if g is not None else fallback
        draws = torch.rand(n + 1, generator=gen, dtype=torch.float64, device=gen.device).to(device)
        rows.append(torch.cat((draws[:n], draws.new_zeros(k - n), draws[n:])))
    return torch.stack(rows)


def _sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of the unnormalised [B, V] probs with uniforms u [B] (float64 cumsum)."""
    c = probs.double().cumsum(dim=1)
    idx = torch.searchsorted(c, (u * c[:, -1])[:, None], right=True).squeeze(1)
    return idx.clamp(max=probs.shape[1] - 1)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) per row, or p itself where that is all zero (p == q: no rejection can occur)."""
    r = (p - q).clamp(min=0)
    empty = r.sum(dim=1, keepdim=True) <= 0
    return torch.where(empty, p, r)


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                   num_draft: torch.Tensor, greedy: torch.Tensor, uniforms: torch.Tensor) -> VerifyResult:
    """Rejection sampling (Leviathan et al. / Chen et al.): the emitted tokens follow target_probs.

    Draft token x at position t is accepted iff u_t * q(x) < p(x) (probability min(1, p/q)); the
    first rejection is replaced by a draw from normalize(max(0, p - q)); when all pass, a bonus
    token is drawn from p at position num_draft. Rows with greedy[b] get `verify_greedy` exactly.
    target_probs [B, K+1, V] and draft_probs [B, K, V] are the distributions actually sampled from
    (after temperature / top-k / top-p), in the target vocabulary.
    """
    b, k = draft_tokens.shape
    x = draft_tokens.long().clamp(min=0)[..., None]
    px = target_probs[:, :k].gather(2, x).squeeze(2).double()
    qx = draft_probs.gather(2, x).squeeze(2).double()
    accept = (uniforms[:, :k] * qx < px) & _valid(num_draft, k)
    accepted = accept.long().cumprod(dim=1).bool()
    n = accepted.sum(dim=1)
    rows = torch.arange(b, device=n.device)
    p_n = target_probs[rows, n].double()
    q_n = torch.cat((draft_probs, draft_probs.new_zeros(b, 1, draft_probs.shape[2])), dim=1)[rows, n].double()
    dist = torch.where((n < num_draft)[:, None], _residual(p_n, q_n), p_n)
    last = _sample_inverse_cdf(dist, uniforms[:, k].double())
    sampled = assemble_result(draft_tokens, accepted, last)
    exact = verify_greedy(target_probs, draft_tokens, num_draft)
    return VerifyResult(num_accepted=torch.where(greedy, exact.num_accepted, sampled.num_accepted),
                        output_tokens=torch.where(greedy[:, None], exact.output_tokens, sampled.output_tokens))


def emitted_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams], res: VerifyResult
                     ) -> tuple[list | None, list | None]:
    """Per verify row and position: the emitted token's logprob (and the top n), when any row asks
    (logits [rows (1 + K), V], params per row)."""
    wanted = [p.logprobs for p in params if p.logprobs is not None]
    if not wanted:
        return None, None
    lp = torch.log_softmax(logits.float(), dim=-1).view(len(params), -1, logits.shape[-1])
    chosen = lp.gather(-1, res.output_tokens.clamp(min=0)[..., None])[..., 0].tolist()
    n = max(wanted)
    if n == 0:
        return chosen, None
    top_lp, top_ids = lp.topk(min(n, lp.shape[-1]), dim=-1)
    tops = [[list(zip(i, v)) for i, v in zip(ri, rv)] for ri, rv in zip(top_ids.tolist(), top_lp.tolist())]
    return chosen, tops
