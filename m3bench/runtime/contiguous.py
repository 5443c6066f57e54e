"""The simple contiguous cache: each sequence owns consecutive pages; prefill, then decode step by step.

Used by tests and as the smallest end-to-end path (the paged engine lives in engine.py).

    outs = greedy_generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, eos_ids=(0,))
"""

from __future__ import annotations

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVCache, KVDtype


class ContiguousRunner:
    """Sequence b owns pages [b * n, (b + 1) * n) with n = ceil(max_len / P)."""

    def __init__(self, model, num_seqs: int, max_len: int, tokens_per_block: int = 16,
                 kv_dtype: KVDtype = KVDtype.AUTO):
        self.model, self.page_size = model, tokens_per_block
        n = -(-max_len // tokens_per_block)
        self.max_len = n * tokens_per_block
        self.page_tables = [list(range(b * n, (b + 1) * n)) for b in range(num_seqs)]
        self.kv = KVCache(model.cfg, num_seqs * n, tokens_per_block, kv_dtype, model.dtype, model.device, model.tp)
        self.lens = [0] * num_seqs

    @torch.no_grad()
    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append tokens to the given sequences; returns each one's logits [len(chunk), V]."""
        seqs = [b for b, c in chunks.items() if c]
        q = [len(chunks[b]) for b in seqs]
        s = [self.lens[b] + n for b, n in zip(seqs, q)]
        if any(x > self.max_len for x in s):
            raise ValueError(f"a sequence would exceed the cache's {self.max_len} tokens")
        meta = build_attn_metadata(q, s, [self.page_tables[b] for b in seqs], self.page_size, self.model.device)
        ids = torch.tensor([t for b in seqs for t in chunks[b]], dtype=torch.int64, device=self.model.device)
        logits = self.model.compute_logits(self.model(ids, meta.positions, meta, self.kv))
        for b, n in zip(seqs, s):
            self.lens[b] = n
        return dict(zip(seqs, logits.split(q)))


def generate(model, prompts: list[list[int]], max_new_tokens: int, eos_ids=(), temperature: float = 0.0,
             seed: int = 0, tokens_per_block: int = 16, kv_dtype: KVDtype = KVDtype.AUTO,
             ) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """(new tokens per prompt, the logits [V] each new token was chosen from)."""
    runner = ContiguousRunner(model, len(prompts), max(map(len, prompts)) + max_new_tokens, tokens_per_block,
                              kv_dtype)
    g = torch.Generator(device=model.device).manual_seed(seed)
    outs: list[list[int]] = [[] for _ in prompts]
    steps: list[list[torch.Tensor]] = [[] for _ in prompts]
    chunks = {b: list(p) for b, p in enumerate(prompts)}
    while chunks:
        logits = runner.step(chunks)
        chunks = {}
        for b, lg in logits.items():
            tok = _choose(lg[-1], temperature, g)
            outs[b].append(tok)
            steps[b].append(lg[-1])
            if tok not in eos_ids and len(outs[b]) < max_new_tokens:
                chunks[b] = [tok]
    return outs, steps


def _choose(logits: torch.Tensor, temperature: float, g: torch.Generator) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=g))


def greedy_generate(model, prompts_ids: list[list[int]], max_new_tokens: int, eos_ids=(),
                    tokens_per_block: int = 16, kv_dtype: KVDtype = KVDtype.AUTO) -> list[list[int]]:
    """Greedy continuations (stopping after an EOS id, which is kept) of each prompt."""
    return generate(model, prompts_ids, max_new_tokens, eos_ids, 0.0, 0, tokens_per_block, kv_dtype)[0]


def prefill_logits(model, ids: list[int], chunk_sizes: list[int] | None = None, tokens_per_block: int = 16,
                   kv_dtype: KVDtype = KVDtype.AUTO) -> torch.Tensor:
    """Logits [len(ids), V] at every position, the sequence fed in chunks (default: one chunk)."""
    runner = ContiguousRunner(model, 1, len(ids), tokens_per_block, kv_dtype)
    sizes = chunk_sizes or [len(ids)]
    if sum(sizes) != len(ids):
        raise ValueError(f"chunk sizes {sizes} do not add up to {len(ids)} tokens")
    out, start = [], 0
    for n in sizes:
        out.append(runner.step({0: ids[start:start + n]})[0])
        start += n
    return torch.cat(out)
