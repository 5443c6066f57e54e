"""JUnit XML for the sweep gate: one test case per sweep point (CI systems render these natively).

m3bench/evals/junit.py writes accuracy verdicts (its cases are tied to accuracy summaries), so the
sweep keeps this small generic writer.
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


def write_junit(path: Path, suite_name: str, cases: Sequence[JUnitCase]) -> Path:
    """One <testsuite> of `cases` in a <testsuites> root."""
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(cases)),
                       failures=str(sum(c.failure is not None for c in cases)), skipped="0")
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name)
        if c.failure is not None:
            ET.SubElement(case, "failure", message=c.failure, type=c.failure_type).text = c.output
        else:
            ET.SubElement(case, "system-out").text = c.output
    root = ET.Element("testsuites")
    root.append(suite)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
