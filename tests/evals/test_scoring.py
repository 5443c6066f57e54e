"""Extraction and normalization on hand-made outputs (lm-eval gsm8k filters, TensorRT-LLM mmlu)."""

import math

import pytest

from m3bench.evals.scoring import (
    INVALID, argmax_index, extract_flexible_last, extract_strict_first, extract_strict_last, gsm8k_match,
    gsm8k_normalize, mean_score, mmlu_gen_correct, plus_minus,
)

GOLD = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 1,018"


@pytest.mark.parametrize("text, strict", [
    ("so the answer is\n#### 1,018", "1,018"),
    ("#### $1018", INVALID),               # strict regex takes no `$`
    ("#### 1018.\n#### 7", "1018."),        # several `####`: strict takes the first
    ("#### -3.5 apples", "-3.5"),
    ("no marker 1018", INVALID),
])
def test_strict_first(text, strict):
    assert extract_strict_first(text) == strict


def test_strict_last_takes_the_last_marker():
    assert extract_strict_last("#### 12\nwait, recheck\n#### 1,018.") == "1,018."
    assert extract_strict_last("nothing") == INVALID


@pytest.mark.parametrize("text, flexible", [
    ("She pays $1,018.", "$1,018."),        # `$`, commas and the trailing period are kept by extraction
    ("3 + 4 = 7 so 7", "7"),                 # single digit via the second group
    ("-12 then 40.", "40."),
    ("no digits", INVALID),
])
def test_flexible_last(text, flexible):
    assert extract_flexible_last(text) == flexible


@pytest.mark.parametrize("raw, norm", [
    ("$1,018.", "1018"), ("1,018", "1018"), ("1018.", "1018"), ("x\n#### 1,018", "1018"),
    ("#### 5\n#### 6", "6"),  # everything up to the last "#### " goes (greedy (?s).*)
    ("ABC", "abc"),
])
def test_normalize(raw, norm):
    assert gsm8k_normalize(raw) == norm


def test_match_against_gold_solution():
    assert gsm8k_match(extract_flexible_last("She pays $1,018."), GOLD)
    assert gsm8k_match(extract_strict_first("#### 1018"), GOLD)
    assert not gsm8k_match(extract_strict_first("#### 1017"), GOLD)
    assert not gsm8k_match(INVALID, "#### [invalid]")  # the fallback never matches


def test_mmlu_gen_and_argmax():
    assert mmlu_gen_correct(" B.", "B") and mmlu_gen_correct("\nC", "C")
    assert mmlu_gen_correct(" The answer", "T")  # starts-with is literal, as TensorRT-LLM's
    assert not mmlu_gen_correct(" b", "B")
    assert argmax_index([-3.0, -1.0, -1.0, -2.0]) == 1  # ties: first index


def test_mean_score_matches_bernoulli_stderr():
    s = mean_score([1, 0, 1, 1])
    assert s.value == pytest.approx(75.0)
    assert s.stderr == pytest.approx(100 * math.sqrt(0.75 * 0.25 / 3))
    with pytest.raises(ValueError):
        mean_score([])


def test_one_item_has_no_stderr_and_says_so():
    """One item: the sample std is undefined (NaN in the Score, null in a record); shown as n/a, never 'nan'."""
    s = mean_score([1])
    assert s.value == 100.0 and math.isnan(s.stderr)
    assert plus_minus(s.stderr) == "± n/a" and plus_minus(None) == "± n/a"
    assert plus_minus(mean_score([1, 0]).stderr) == "± 50.00"
