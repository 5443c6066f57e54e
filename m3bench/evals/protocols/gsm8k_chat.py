"""GSM8K, chat protocol (InferenceX / TensorRT-LLM `gsm8k_inferencex`), for reasoning models.

The chat template is applied by the backend; the k few-shot rows (lm-eval's draws, as in `gsm8k`) are
earlier user / assistant turns, every user turn is

    Question: {question}\\nEnd your response with the answer on the last line, formatted as: #### [number]\\nAnswer:

and the verdict is strict-match on the *last* `#### N`. The budget is large; answers that hit it are
counted (`cap_hit`): a truncated answer is wrong and says nothing about the model.
"""

from __future__ import annotations

from typing import Sequence

from m3bench.evals.backends.base import GenRequest, GenResult
from m3bench.evals.datasets import GsmRow
from m3bench.evals.protocols.base import Item, Judgement
from m3bench.evals.protocols.gsm8k import Gsm8k
from m3bench.evals.scoring import extract_strict_last, gsm8k_match

DEFAULT_MAX_TOKENS = 8192
INSTRUCTION = "End your response with the answer on the last line, formatted as: #### [number]"


def user_turn(question: str) -> str:
    return f"Question: {question}\n{INSTRUCTION}\nAnswer:"


class Gsm8kChat(Gsm8k):
    """The same items and few-shot draws as `gsm8k`, asked as chat turns and judged by the last `####`."""

    name = "gsm8k-chat"
    version = "inferencex-gsm8k/m3bench-1"
    metrics = ("strict-match",)
    chat = True
    default_max_tokens = DEFAULT_MAX_TOKENS

    def _item(self, index: int, row: GsmRow, shots: Sequence[GsmRow], max_tokens: int) -> Item:
        turns: list[dict[str, str]] = []
        for s in shots:
            turns += [{"role": "user", "content": user_turn(s.question)}, {"role": "assistant", "content": s.answer}]
        turns.append({"role": "user", "content": user_turn(row.question)})
        request = GenRequest(messages=tuple(turns), max_tokens=max_tokens)
        return Item(f"test/{index}", (request,), row.answer)

    def judge(self, item: Item, outputs: Sequence[GenResult]) -> Judgement:
        text = outputs[0].text
        strict = extract_strict_last(text)
        ok = gsm8k_match(strict, item.gold)
        return Judgement(float(ok), strict, {"strict-match": ok}, outputs[0].finish_reason == "length")
