"""JUnit XML of m3bench's verdicts (accuracy, acceptance, sweep gate): one test case per verdict.

    write_junit(Path("verdicts.xml"), "m3bench.accuracy", [JUnitCase("m3bench.accuracy.model", "mmlu", "...")])
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class JUnitCase:
    classname: str
    name: str
    output: str = ""
    failure: str | None = None  # message of a failed case
    failure_type: str = "Regression"
    skipped: str | None = None  # message of a case that was not gated


def _case(suite: ET.Element, c: JUnitCase) -> None:
    case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name)
    if c.failure is not None:
        ET.SubElement(case, "failure", message=c.failure, type=c.failure_type).text = c.output
    elif c.skipped is not None:
        ET.SubElement(case, "skipped", message=c.skipped)
    else:
        ET.SubElement(case, "system-out").text = c.output


def write_junit(path: Path, suite_name: str, cases: Sequence[JUnitCase]) -> Path:
    """One <testsuite> of `cases` in a <testsuites> root."""
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(cases)),
                       failures=str(sum(c.failure is not None for c in cases)),
                       skipped=str(sum(c.failure is None and c.skipped is not None for c in cases)))
    for c in cases:
        _case(suite, c)
    root = ET.Element("testsuites")
    root.append(suite)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
