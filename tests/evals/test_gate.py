"""TensorRT-LLM's hypothesis-test threshold: measurement.md's figures."""

import math

import pytest

from m3bench.evals.gate import Verdict, make_gate, sigma_from_reference


def test_gsm8k_1319_samples():
    g = make_gate(91.32, 1319)
    assert g.threshold - 91.32 == pytest.approx(-3.20, abs=0.005)
    assert g.theta == pytest.approx(4.84, abs=0.005)


def test_mmlu_4096_samples():
    assert make_gate(85.11, 4096).threshold - 85.11 == pytest.approx(-1.82, abs=0.005)


def test_formula_against_scale():
    g = make_gate(50.0, 100, sigma=30.0, alpha=0.1, beta=0.3)
    scale = math.sqrt(2 * 30.0**2 / 100)
    assert g.threshold == pytest.approx(50.0 - 1.2815515655446004 * scale)
    assert g.theta == pytest.approx((1.2815515655446004 + 0.5244005127080407) * scale)


def test_sigma_from_reference_and_floor():
    assert sigma_from_reference(90.0) == pytest.approx(30.0)
    g = make_gate(90.0, 1319, sigma=sigma_from_reference(90.0))
    assert 90.0 - g.threshold < 3.20  # tighter than worst-case sigma 50
    assert make_gate(90.0, 10, floor=88.0).threshold == 88.0
    assert g.verdict(g.threshold) is Verdict.PASS and g.verdict(g.threshold - 1e-9) is Verdict.FAIL


def test_a_gate_on_too_few_items_says_it_cannot_fail():
    """At n=1 against a reference of 80.5 the threshold is below 0: no score fails (the CLI warns, the summary says
    gate_can_fail false); at 10 items a score of 0 fails; a golden's ceiling below 100 can always fail."""
    one = make_gate(80.5, 1)
    assert one.threshold < 0 and not one.can_fail
    assert one.verdict(0.0) is Verdict.PASS and one.verdict(100.0) is Verdict.PASS
    ten = make_gate(80.5, 10)
    assert ten.can_fail and ten.verdict(0.0) is Verdict.FAIL
    assert make_gate(80.5, 1, ceiling=81.5).can_fail
    assert not make_gate(80.5, 1, ceiling=100.0).can_fail
