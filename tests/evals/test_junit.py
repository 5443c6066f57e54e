"""JUnit XML of verdicts: failures, skips and passes on hand-made summaries."""

import xml.etree.ElementTree as ET

from m3bench.evals.junit import write_junit


def _summary(task, verdict, score, threshold):
    return {"task": task, "protocol": task, "score": score, "n": 100, "verdict": verdict, "threshold": threshold,
            "theta": 4.0, "reference": {"accuracy": 90.0}}


def test_junit_cases(tmp_path):
    path = write_junit(tmp_path / "j.xml", [_summary("mmlu", "pass", 91.0, 88.0), _summary("gsm8k", "fail", 80.0, 88.0),
                                            _summary("mmlu-gen", "no_reference", 50.0, None)], "org/m")
    suite = ET.parse(path).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["mmlu"].find("failure") is None and cases["mmlu"].find("skipped") is None
    assert "80.00" in cases["gsm8k"].find("failure").get("message") and "88.00" in cases["gsm8k"].find("failure").get("message")
    assert cases["mmlu-gen"].find("skipped") is not None


def test_junit_pass_says_when_the_gate_could_not_fail(tmp_path):
    small = {**_summary("mmlu", "pass", 100.0, -35.8), "n": 1, "gate_can_fail": False}
    path = write_junit(tmp_path / "j.xml", [small, _summary("gsm8k", "pass", 91.0, 88.0)], "org/m")
    text = {c.get("name"): ET.tostring(c, encoding="unicode") for c in ET.parse(path).getroot().iter("testcase")}
    assert "no score can fail" in text["mmlu"] and "no score can fail" not in text["gsm8k"]
