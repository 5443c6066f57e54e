"""Real checkpoints (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct) through the whole load path:
CheckpointReader -> M3ForCausalLM.load_weights -> greedy decoding, against transformers' generate.

Both sides run in float32 from the bf16 weights on disk (bf16 -> fp32 is exact), so greedy tokens must
be identical and the chosen tokens' logprobs agree far inside bf16 tolerance. 20 chat prompts, 64 new
tokens, batched on both sides. Skipped when the checkpoints are not fetched (see tests/conftest.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from m3bench.runtime.checkpoint import CheckpointReader
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.tokenizer import Tokenizer

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]

MAX_NEW_TOKENS = 64
LOGPROB_ATOL = 2e-3  # fp32 vs fp32: differences are summation order only; bf16 rounding alone is ~1e-2
PROMPTS = [
    "What is the capital of France?", "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.", "Write a Python function that reverses a string.",
    "What is 17 times 23?", "Give three tips for staying focused while studying.",
    "Translate 'good morning' into Spanish and German.", "What causes the seasons on Earth?",
    "Write a SQL query that counts rows in a table named users.", "Summarize the plot of Romeo and Juliet.",
    "What is the difference between a list and a tuple in Python?", "Name five prime numbers greater than 50.",
    "How do I read a file line by line in Python?", "Why is the sky blue?",
    "Write a short poem about the sea.", "What does HTTP stand for, and what is it used for?",
    "Write a bash command that finds all .txt files in a directory.", "Explain recursion to a child.",
    "If a train travels 60 km in 45 minutes, what is its speed in km/h?", "List the planets of the solar system.",
]


@dataclass(frozen=True)
class Run:
    tokens: list[list[int]]  # new tokens per prompt, cut after the first EOS (kept)
    logprobs: list[list[float]]  # log p(chosen token) at each new position


def _cut(tokens: list[int], logprobs: list[float], eos: tuple[int, ...]) -> tuple[list[int], list[float]]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1], logprobs[:i + 1]
    return tokens, logprobs


def runtime_greedy(path: Path, prompts: list[list[int]], eos: tuple[int, ...]) -> Run:
    from m3bench.runtime.contiguous import generate
    from m3bench.runtime.model import M3ForCausalLM

    cfg = ModelConfig.from_pretrained(path)
    reader = CheckpointReader(path, cfg)
    reader.validate()
    model = M3ForCausalLM(cfg, dtype=torch.float32, device="cpu")
    model.load_weights(reader)
    outs, steps = generate(model, prompts, MAX_NEW_TOKENS, eos_ids=eos)
    lps = [[float(torch.log_softmax(lg.double(), -1)[t]) for t, lg in zip(o, s)] for o, s in zip(outs, steps)]
    return Run(*map(list, zip(*(_cut(o, lp, eos) for o, lp in zip(outs, lps)))))


def hf_greedy(path: Path, prompts: list[list[int]], eos: tuple[int, ...], pad_id: int) -> Run:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             use_cache=True, eos_token_id=list(eos), pad_token_id=pad_id,
                             output_logits=True, return_dict_in_generate=True)
    new = out.sequences[:, width:]
    lps = torch.stack([torch.log_softmax(lg.double(), -1) for lg in out.logits], dim=1)  # [B, steps, V]
    chosen = lps.gather(-1, new[:, :lps.shape[1], None]).squeeze(-1)
    runs = [_cut(new[b].tolist(), chosen[b].tolist(), eos) for b in range(len(prompts))]
    return Run(*map(list, zip(*runs)))


@pytest.fixture(scope="module", params=["smollm2_dir", "qwen05_dir"])
def runs(request) -> tuple[Run, Run]:
    path = request.getfixturevalue(request.param)
    tok = Tokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    pad = tok.hf.pad_token_id if tok.hf.pad_token_id is not None else tok.eos_token_ids[0]
    eos = tok.eos_token_ids
    return runtime_greedy(path, prompts, eos), hf_greedy(path, prompts, eos, pad)


def test_greedy_tokens_equal_transformers(runs):
    ours, ref = runs
    assert sum(map(len, ref.tokens)) >= 10 * MAX_NEW_TOKENS  # most prompts run to the limit
    for i, (a, b) in enumerate(zip(ours.tokens, ref.tokens)):
        assert a == b, f"prompt {i} ({PROMPTS[i]!r}) diverges at new token {_first_diff(a, b)}"


def test_logprobs_agree_with_transformers(runs):
    ours, ref = runs
    worst = 0.0
    for a, b in zip(ours.logprobs, ref.logprobs):
        n = min(len(a), len(b))
        worst = max(worst, max((abs(x - y) for x, y in zip(a[:n], b[:n])), default=0.0))
    assert worst < LOGPROB_ATOL, f"max |logprob difference| {worst:.2e}"


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
