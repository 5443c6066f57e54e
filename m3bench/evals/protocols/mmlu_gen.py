"""MMLU, generative (TensorRT-LLM `trtllm-eval mmlu`, the protocol of the MiniMax-M3 reference).

5-shot from dev, greedy, max_tokens=2; correct when the stripped output starts with the gold letter.
TensorRT-LLM's own text, kept exactly: the header joins the subject's words with a leading space
("about  abstract algebra.": two spaces), the question is not stripped. With a limit n it samples
ceil(n / 57) items per subject, in subject order, from one numpy RandomState(seed 0) (pandas
`DataFrame.sample` on the global numpy state, which TensorRT-LLM seeds with 0).
"""

from __future__ import annotations

import math
from typing import Sequence

from m3bench.evals.backends.base import GenRequest, GenResult
from m3bench.evals.datasets import DatasetName, MmluRow, Split
from m3bench.evals.protocols.base import Item, Judgement, Protocol, RequestKind, Settings
from m3bench.evals.protocols.mmlu import dev_by_subject
from m3bench.evals.protocols.mmlu_subjects import LETTERS, SUBJECTS
from m3bench.evals.scoring import mmlu_gen_correct

DEFAULT_MAX_TOKENS = 2


def trtllm_header(subject: str) -> str:
    spaced = "".join(" " + word for word in subject.split("_"))
    return f"The following are multiple choice questions (with answers) about {spaced}.\n\n"


def trtllm_item(row: MmluRow, answer: bool) -> str:
    text = row.question + "".join(f"\n{letter}. {c}" for letter, c in zip(LETTERS, row.choices, strict=True)) + "\nAnswer:"
    return text + (f" {LETTERS[row.answer]}\n\n" if answer else "")


def trtllm_sample(test: Sequence[MmluRow], limit: int | None, seed: int) -> list[int]:
    """Indices TensorRT-LLM evaluates: per subject in order, all rows or `ceil(limit/57)` sampled ones."""
    import numpy as np

    per_subject = None if limit is None else math.ceil(limit / len(SUBJECTS))
    state = np.random.RandomState(seed)
    rows_of: dict[str, list[int]] = {}
    for i, row in enumerate(test):
        rows_of.setdefault(row.subject, []).append(i)
    chosen: list[int] = []
    for subject in SUBJECTS:
        rows = rows_of.get(subject, [])
        if per_subject is not None and per_subject < len(rows):
            rows = [rows[j] for j in state.choice(len(rows), size=per_subject, replace=False)]
        chosen.extend(rows)
    return chosen


class MmluGenerative(Protocol):
    name = "mmlu-gen"
    version = "trtllm-mmlu/m3bench-1"
    dataset = DatasetName.MMLU
    kind = RequestKind.GENERATE
    metrics = ("acc",)
    default_fewshot = 5
    fewshot_split = "dev"
    default_max_tokens = DEFAULT_MAX_TOKENS

    def build_items(self, splits: dict[str, Split], settings: Settings) -> list[Item]:
        test = splits["test"].rows
        shots = dev_by_subject(splits.get("dev"), self.fewshot(settings))
        max_tokens = self.max_tokens(settings)
        chosen = trtllm_sample(test, settings.limit, settings.seed)
        return [self._item(i, test[i], shots.get(test[i].subject, []), max_tokens) for i in chosen]

    def _item(self, index: int, row: MmluRow, shots: Sequence[MmluRow], max_tokens: int) -> Item:
        prompt = trtllm_header(row.subject) + "".join(trtllm_item(s, True) for s in shots) + trtllm_item(row, False)
        request = GenRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0)
        return Item(f"test/{index}", (request,), LETTERS[row.answer], row.subject)

    def judge(self, item: Item, outputs: Sequence[GenResult]) -> Judgement:
        text = outputs[0].text
        ok = mmlu_gen_correct(text, item.gold)
        return Judgement(float(ok), text.strip()[:1], {"acc": ok})  # max_tokens=2: the cap is the design
