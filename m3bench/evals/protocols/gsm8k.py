"""GSM8K (lm-evaluation-harness `gsm8k`, version 3): 5-shot from train, greedy, 256 new tokens.

    Question: {shot question}\\nAnswer: {shot full solution}\\n\\n   (x k)
    Question: {question}\\nAnswer:

Few-shot rows follow lm-eval's default sampler exactly: one `random.Random(1234)` (lm-eval's
fewshot_random_seed) draws `sample(train, k)` for each test row in test order, so row i gets the
(i+1)-th draw whatever --limit selects. Score = mean of strict-match and flexible-extract
(TensorRT-LLM's gsm8k figure); both are reported.
"""

from __future__ import annotations

import random
from typing import Sequence

from m3bench.evals.backends.base import GenRequest, GenResult
from m3bench.evals.datasets import DatasetName, GsmRow, Split
from m3bench.evals.protocols.base import Item, Judgement, Protocol, RequestKind, Settings, shuffled_prefix
from m3bench.evals.scoring import extract_flexible_last, extract_strict_first, gsm8k_match
from m3bench.runtime.errors import InputError

LM_EVAL_FEWSHOT_SEED = 1234
STOP = ("Question:", "</s>", "<|im_end|>")
DEFAULT_MAX_TOKENS = 256


def lm_eval_shots(test_size: int, train: Sequence[GsmRow], k: int) -> list[list[GsmRow]]:
    """Few-shot rows of every test row, drawn in test order from one Random(1234)."""
    if k == 0:
        return [[] for _ in range(test_size)]
    rnd = random.Random(LM_EVAL_FEWSHOT_SEED)
    return [[train[j] for j in rnd.sample(range(len(train)), k)] for _ in range(test_size)]


def fewshot_train(splits: dict[str, Split], k: int, name: str) -> Sequence[GsmRow]:
    if k == 0:
        return ()
    if "train" not in splits:
        raise InputError(f"{k}-shot {name} needs the GSM8K train split")
    return splits["train"].rows


def question_text(question: str) -> str:
    return f"Question: {question}\nAnswer:"


class Gsm8k(Protocol):
    name = "gsm8k"
    version = "lm-eval-gsm8k-3.0/m3bench-1"
    dataset = DatasetName.GSM8K
    kind = RequestKind.GENERATE
    metrics = ("strict-match", "flexible-extract")
    default_fewshot = 5
    fewshot_split = "train"
    default_max_tokens = DEFAULT_MAX_TOKENS

    def build_items(self, splits: dict[str, Split], settings: Settings) -> list[Item]:
        """lm-eval's few-shot draws for every test row, then the seeded subset (`--limit`)."""
        test = splits["test"].rows
        k = self.fewshot(settings)
        shots = lm_eval_shots(len(test), fewshot_train(splits, k, self.name), k)
        max_tokens = self.max_tokens(settings)
        chosen = shuffled_prefix(range(len(test)), settings.limit, settings.seed)
        return [self._item(i, test[i], shots[i], max_tokens) for i in chosen]

    def _item(self, index: int, row: GsmRow, shots: Sequence[GsmRow], max_tokens: int) -> Item:
        examples = "".join(f"{question_text(s.question)} {s.answer}\n\n" for s in shots)
        request = GenRequest(prompt=examples + question_text(row.question), max_tokens=max_tokens, stop=STOP)
        return Item(f"test/{index}", (request,), row.answer)

    def judge(self, item: Item, outputs: Sequence[GenResult]) -> Judgement:
        text = outputs[0].text
        strict, flexible = extract_strict_first(text), extract_flexible_last(text)
        correct = {"strict-match": gsm8k_match(strict, item.gold), "flexible-extract": gsm8k_match(flexible, item.gold)}
        value = (correct["strict-match"] + correct["flexible-extract"]) / 2
        extracted = {"strict-match": strict, "flexible-extract": flexible}
        return Judgement(value, strict, correct, outputs[0].finish_reason == "length", extracted)
