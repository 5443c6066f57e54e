"""Shared pieces of the speculative engine tests: the tiny target, a random draft, an oracle draft.

The oracle draft runs the real Eagle3 forward (so the draft KV, features and layouts are exercised)
but its logits are one-hot at the token a reference continuation puts next: the draft at position p
reads token p + 1 and proposes token p + 2, looked up by (p, token p + 1) in the reference sequences.
With `wrong_every=m`, every position p with p % m == 0 proposes a wrong token, so acceptance counts
vary and rollbacks happen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/runtime: engine_fixtures

from engine_fixtures import random_prompts, small_model  # noqa: E402

from m3bench.runtime.llm import LLM, SamplingParams  # noqa: E402
from m3bench.runtime.speculative.draft import DraftOutput, Eagle3Draft  # noqa: E402
from m3bench.runtime.speculative.tiny_draft import tiny_draft_config  # noqa: E402

__all__ = ["random_prompts", "small_model", "random_draft", "OracleDraft", "llm_args", "greedy_reference",
           "LLM", "SamplingParams"]


def random_draft(model, seed: int = 1) -> Eagle3Draft:
    d = Eagle3Draft(tiny_draft_config(model.cfg), model.dtype, model.device)
    d.init_dummy(seed)
    return d


class OracleDraft(Eagle3Draft):
    def __init__(self, model, sequences: list[list[int]], wrong_every: int = 0, seed: int = 1, default: int = 0):
        super().__init__(tiny_draft_config(model.cfg), model.dtype, model.device)
        self.init_dummy(seed)
        self.vocab = model.cfg.vocab_size
        self.wrong_every, self.default = wrong_every, default  # default: the proposal where the table has none
        self.next: dict[tuple[int, int], int] = {}
        for s in sequences:
            for p in range(len(s) - 2):
                self.next[(p, s[p + 1])] = s[p + 2]

    def forward(self, input_ids, positions, feature, meta, kv) -> DraftOutput:
        out = super().forward(input_ids, positions, feature, meta, kv)
        picks = [self._oracle(p, t) for p, t in zip(positions.tolist(), input_ids.tolist())]
        hidden = torch.nn.functional.one_hot(torch.tensor(picks, device=input_ids.device), self.vocab).float() * 10.0
        return DraftOutput(hidden=hidden, feature=out.feature)

    def _oracle(self, pos: int, token: int) -> int:
        want = self.next.get((pos, token), self.default)
        if self.wrong_every and pos % self.wrong_every == 0:
            return (want + 1) % self.vocab
        return want

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float()


def llm_args(**over) -> dict:
    args = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=96, max_batch_size=8, max_num_tokens=256)
    return {**args, **over}


def greedy_reference(model, prompts: list[list[int]], max_tokens: int, **over) -> list[list[int]]:
    """Non-speculative greedy continuations (ignore_eos) of the same engine settings."""
    outs = LLM(model, **llm_args(**over)).generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [o.token_ids for o in outs]
