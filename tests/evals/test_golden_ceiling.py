"""A golden's ceiling: a deterministic run whose score leaves the golden band either way fails (exit 1)."""

from __future__ import annotations

from m3bench.evals.gate import Verdict, make_gate
from m3bench.evals.junit import write_junit
from m3bench.evals.references import ProtocolSpec, RunSpec, find_accuracy_reference

MMLU_0 = ProtocolSpec("mmlu", "lm-eval-mmlu-1.0/m3bench-1", 0, False)


def test_gate_fails_outside_the_band_and_only_there():
    gate = make_gate(70.0, 100, floor=68.0, ceiling=72.0)
    assert [gate.verdict(s) for s in (67.9, 68.0, 70.0, 72.0, 72.1)] == [
        Verdict.FAIL, Verdict.PASS, Verdict.PASS, Verdict.PASS, Verdict.FAIL]
    assert make_gate(70.0, 100, floor=68.0).verdict(99.0) is Verdict.PASS  # no ceiling: one-sided, as before


def test_ceiling_is_read_from_the_reference_file(tmp_path):
    ref = tmp_path / "mmlu.yaml"
    ref.write_text("m/x:\n  - protocol: mmlu\n    protocol_version: lm-eval-mmlu-1.0/m3bench-1\n    num_fewshot: 0\n"
                   "    chat: false\n    accuracy: 70.0\n    threshold: 68.0\n    ceiling: 72.0\n")
    entry = find_accuracy_reference("mmlu", "m/x", RunSpec(), MMLU_0, ref)
    assert entry.ceiling == 72.0 and entry.to_dict()["ceiling"] == 72.0
    assert entry.gate(100).verdict(75.0) is Verdict.FAIL and entry.gate(100).verdict(71.0) is Verdict.PASS


def test_junit_says_which_bound_failed(tmp_path):
    base = {"task": "mmlu", "protocol": "mmlu", "n": 100, "reference": {}, "theta": 1.0, "threshold": 68.0}
    write_junit(tmp_path / "j.xml", [{**base, "score": 75.0, "ceiling": 72.0, "verdict": "fail"},
                                     {**base, "score": 60.0, "ceiling": 72.0, "verdict": "fail"}], "m/x")
    text = (tmp_path / "j.xml").read_text()
    assert "75.00 on n=100 &gt; ceiling 72.00" in text and "60.00 on n=100 &lt; threshold 68.00" in text
