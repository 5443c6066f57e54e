"""JUnit XML of accuracy verdicts, one test case per task (CI systems render these natively)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Sequence


def _case(summary: dict[str, Any], model_id: str) -> ET.Element:
    case = ET.Element("testcase", classname=f"m3bench.accuracy.{model_id}", name=summary["task"])
    threshold = summary.get("threshold")
    line = f"{summary['task']} ({summary['protocol']}): {summary['score']:.2f} on n={summary['n']}"
    if summary["verdict"] == "fail":
        failure = ET.SubElement(case, "failure", message=f"{line} < threshold {threshold:.2f}", type="AccuracyRegression")
        failure.text = f"reference {summary['reference']}\ntheta {summary['theta']:.2f}"
    elif summary["verdict"] == "no_reference":
        ET.SubElement(case, "skipped", message=f"{line}; not gated (--no-reference)")
    else:
        ET.SubElement(case, "system-out").text = f"{line} >= threshold {threshold:.2f}"
    return case


def write_junit(path: Path, summaries: Sequence[dict[str, Any]], model_id: str) -> Path:
    suite = ET.Element("testsuite", name="m3bench.accuracy", tests=str(len(summaries)),
                       failures=str(sum(s["verdict"] == "fail" for s in summaries)),
                       skipped=str(sum(s["verdict"] == "no_reference" for s in summaries)))
    for summary in summaries:
        suite.append(_case(summary, model_id))
    root = ET.Element("testsuites")
    root.append(suite)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
