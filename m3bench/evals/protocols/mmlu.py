"""MMLU, loglikelihood (lm-evaluation-harness `mmlu`): argmax of log P(" A".." D" | prompt).

    The following are multiple choice questions (with answers) about abstract algebra.\\n\\n
    [k dev items of the subject, each "{item} {letter}\\n\\n"]
    {question.strip()}\\nA. {c0}\\nB. {c1}\\nC. {c2}\\nD. {c3}\\nAnswer:
"""

from __future__ import annotations

from typing import Sequence

from m3bench.evals.backends.base import ScoreRequest, ScoreResult
from m3bench.evals.datasets import DatasetName, MmluRow, Split
from m3bench.evals.protocols.base import Item, Judgement, Protocol, RequestKind, Settings, stratified_prefix
from m3bench.evals.protocols.mmlu_subjects import LETTERS, lm_eval_header
from m3bench.evals.scoring import argmax_index
from m3bench.runtime.errors import InputError

MAX_FEWSHOT = 5  # dev holds 5 items per subject


def lm_eval_item(row: MmluRow) -> str:
    """lm-eval's doc_to_text for MMLU."""
    c = row.choices
    return f"{row.question.strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def dev_by_subject(dev: Split | None, k: int) -> dict[str, list[MmluRow]]:
    """The first k dev rows of each subject (lm-eval's first_n sampler); InputError when dev is short."""
    if k == 0:
        return {}
    if dev is None:
        raise InputError(f"{k}-shot MMLU needs the dev split")
    shots: dict[str, list[MmluRow]] = {}
    for row in dev.rows:
        shots.setdefault(row.subject, []).append(row)
    short = sorted(s for s, rows in shots.items() if len(rows) < k)
    if short or k > MAX_FEWSHOT:
        raise InputError(f"{k}-shot MMLU: dev has fewer than {k} items for {short or 'every subject'}")
    return {s: rows[:k] for s, rows in shots.items()}


def lm_eval_prompt(row: MmluRow, shots: Sequence[MmluRow]) -> str:
    examples = "".join(f"{lm_eval_item(s)} {LETTERS[s.answer]}\n\n" for s in shots)
    return lm_eval_header(row.subject) + examples + lm_eval_item(row)


class MmluLoglikelihood(Protocol):
    name = "mmlu"
    version = "lm-eval-mmlu-1.0/m3bench-1"
    dataset = DatasetName.MMLU
    kind = RequestKind.SCORE
    metrics = ("acc",)
    default_fewshot = 0
    fewshot_split = "dev"

    def build_items(self, splits: dict[str, Split], settings: Settings) -> list[Item]:
        test = splits["test"].rows
        shots = dev_by_subject(splits.get("dev"), self.fewshot(settings))
        chosen = stratified_prefix([r.subject for r in test], settings.limit, settings.seed)
        return [self._item(i, test[i], shots.get(test[i].subject, [])) for i in chosen]

    def _item(self, index: int, row: MmluRow, shots: Sequence[MmluRow]) -> Item:
        prompt = lm_eval_prompt(row, shots)
        requests = tuple(ScoreRequest(prompt, f" {letter}") for letter in LETTERS)
        return Item(f"test/{index}", requests, LETTERS[row.answer], row.subject)

    def judge(self, item: Item, outputs: Sequence[ScoreResult]) -> Judgement:
        picked = LETTERS[argmax_index([o.logprob for o in outputs])]
        ok = picked == item.gold
        return Judgement(float(ok), picked, {"acc": ok})
