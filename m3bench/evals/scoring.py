"""Answer extraction and normalization: one definition each, shared by every protocol.

    extract_strict_first("... #### 1,234.") -> "1,234."
    gsm8k_normalize("$1,234.") -> "1234"
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

# lm-eval gsm8k filters (tasks/gsm8k/gsm8k.yaml)
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# lm-eval exact_match `regexes_to_ignore`, applied in this order to prediction and gold
_IGNORE = tuple(re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$"))
INVALID = "[invalid]"  # lm-eval's fallback when a regex filter finds nothing


def _select(pattern: re.Pattern, text: str, index: int) -> str:
    """lm-eval RegexFilter: findall, pick one match, first non-empty group of a tuple, strip."""
    found = pattern.findall(text)
    if not found:
        return INVALID
    match = found[index]
    if isinstance(match, tuple):
        match = next((g for g in match if g), INVALID)
    return match.strip()


def extract_strict_first(text: str) -> str:
    """strict-match: first `#### N`."""
    return _select(STRICT_RE, text, 0)


def extract_strict_last(text: str) -> str:
    """Chat protocol strict-match: last `#### N` (reasoning models restate answers)."""
    return _select(STRICT_RE, text, -1)


def extract_flexible_last(text: str) -> str:
    """flexible-extract: last number-like run."""
    return _select(FLEXIBLE_RE, text, -1)


def gsm8k_normalize(text: str) -> str:
    """Drop `,`, `$`, everything up to `#### `, a trailing `.`; lower-case (ignore_case)."""
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def gsm8k_gold(answer: str) -> str:
    """The normalized gold number of a GSM8K solution."""
    return gsm8k_normalize(answer)


def gsm8k_match(extracted: str, gold_answer: str) -> bool:
    return extracted != INVALID and gsm8k_normalize(extracted) == gsm8k_gold(gold_answer)


def mmlu_gen_correct(output: str, gold_letter: str) -> bool:
    """TensorRT-LLM mmlu: the stripped output starts with the gold letter."""
    return output.strip().startswith(gold_letter)


def argmax_index(values: Sequence[float]) -> int:
    """First index of the maximum (numpy.argmax tie rule, as lm-eval)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


@dataclass(frozen=True)
class Score:
    """Mean of per-item values on the 0-100 scale, with its standard error (sample std, ddof 1, as lm-eval)."""

    value: float
    stderr: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"score": self.value, "stderr": self.stderr, "n": self.n}


def plus_minus(stderr: float | None) -> str:
    """`± 1.23`, or `± n/a` where the standard error is undefined (one item: NaN; null in a record)."""
    return "± n/a" if stderr is None or not math.isfinite(stderr) else f"± {stderr:.2f}"


def mean_score(values: Sequence[float]) -> Score:
    """Score of 0/1 verdicts (or 0..1 item values); an empty sample is an error, never 0."""
    n = len(values)
    if n == 0:
        raise ValueError("no items scored: an empty sample has no accuracy")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return Score(100.0 * mean, 100.0 * math.sqrt(var / n), n)
