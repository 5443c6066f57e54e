"""Token sampling on the device: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Sampling uses the exponential race (argmax of p / q with q ~ Exp(1) is a draw from p). A seeded
request draws its q from its own torch.Generator, so its tokens do not depend on which other
requests share the batch; unseeded requests share the sampler's generator.

    sampler = Sampler(device, seed=0)
    out = sampler(logits[N, V] float32, [seq.params for seq in rows], [seq.generator ...])
    out.token_ids [N] int64, out.logprobs [N] or None, out.top_ids / out.top_logprobs [N, n] or None
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from m3bench.runtime.sequence import SamplingParams
from m3bench.runtime.transfer import upload_list


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [N] int64
    logprobs: torch.Tensor | None  # [N] float32 logprob of the chosen token under the model's distribution
    top_ids: torch.Tensor | None  # [N, n] int64
    top_logprobs: torch.Tensor | None  # [N, n] float32


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


class Sampler:
    def __init__(self, device: torch.device | str, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = make_generator(seed, self.device)

    def __call__(self, logits: torch.Tensor, params: Seq[SamplingParams],
                 generators: Seq[torch.Generator | None], banned: Seq[Seq[int]] | None = None) -> SamplerOutput:
        """Sample one token per row of `logits`; `banned[i]` are token ids row i may not emit (min_tokens)."""
        raw = logits.float()
        x = _ban(raw, banned) if banned and any(banned) else raw
        greedy = x.argmax(dim=-1)
        if all(p.greedy for p in params):
            tokens = greedy
        else:
            tokens = self._random(x, params, generators, greedy)
        return _with_logprobs(raw, tokens, params)

    def _random(self, x: torch.Tensor, params: Seq[SamplingParams], generators: Seq[torch.Generator | None],
                greedy: torch.Tensor) -> torch.Tensor:
        temp = upload_list([p.temperature if p.temperature > 0 else 1.0 for p in params], torch.float32, x.device)
        x = x / temp[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            x = top_k_top_p(x, [p.top_k for p in params], [p.top_p for p in params])
        probs = torch.softmax(x, dim=-1)
        q = self._exponential(probs, generators)
        sampled = (probs / q).argmax(dim=-1)
        is_greedy = upload_list([p.greedy for p in params], torch.bool, x.device)
        return torch.where(is_greedy, greedy, sampled)

    def _exponential(self, probs: torch.Tensor, generators: Seq[torch.Generator | None]) -> torch.Tensor:
        q = torch.empty_like(probs)
        q.exponential_(generator=self.generator)
        for i, g in enumerate(generators):
            if g is not None:  # seeded: its own stream, one draw of V per step whatever the batch
                q[i].exponential_(generator=g)
        return q


def top_k_top_p(x: torch.Tensor, top_k: Seq[int], top_p: Seq[float]) -> torch.Tensor:
    """Set to -inf the logits outside each row's top-k and top-p nucleus (k 0 / p 1: off; keeps >= 1)."""
    k = upload_list([effective_top_k(kk, x.shape[-1]) for kk in top_k], torch.int64, x.device)
    return top_k_top_p_rows(x, k, upload_list(list(top_p), torch.float32, x.device))


def effective_top_k(top_k: int, vocab: int) -> int:
    """A request's top-k as the filter runs it: 1..vocab (0, off, and anything past the vocabulary: vocab)."""
    return top_k if 0 < top_k < vocab else vocab


def top_k_top_p_rows(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """top_k_top_p with the rows' k (int64, 1..V) and p (float32) as device tensors (no host reads)."""
    V = x.shape[-1]
    sorted_x, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=x.device)[None, :]
    drop = rank >= k[:, None]
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
    drop = before >= p[:, None]
    drop[:, 0] = False
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(-1, order, sorted_x)


def _ban(x: torch.Tensor, banned: Seq[Seq[int]]) -> torch.Tensor:
    rows = [i for i, b in enumerate(banned) for _ in b]
    cols = [t for b in banned for t in b]
    idx = upload_list([rows, cols], torch.int64, x.device)
    x = x.clone()
    x[idx[0], idx[1]] = float("-inf")
    return x


def _with_logprobs(raw: torch.Tensor, tokens: torch.Tensor, params: Seq[SamplingParams]) -> SamplerOutput:
    wanted = [p.logprobs for p in params if p.logprobs is not None]
    if not wanted:
        return SamplerOutput(tokens, None, None, None)
    lp = torch.log_softmax(raw, dim=-1)
    chosen = lp.gather(-1, tokens[:, None])[:, 0]
    n = max(wanted)
    if n == 0:
        return SamplerOutput(tokens, chosen, None, None)
    top_lp, top_ids = lp.topk(min(n, lp.shape[-1]), dim=-1)
    return SamplerOutput(tokens, chosen, top_ids, top_lp)
