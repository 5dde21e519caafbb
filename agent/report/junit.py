"""JUnit XML: one testsuite per area, one testcase per finding.

fail -> <failure>, unknown -> <error> (the check could not run), skip and
waived -> <skipped>, warn -> passes with the message in <system-out>.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent.engine import Report
from agent.model import Finding, Status


def render_junit(report: Report) -> str:
    suites = ET.Element("testsuites", name="nodewarden", time=f"{report.duration_s:.3f}")
    by_area: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_area.setdefault(finding.check.split(".", 1)[0], []).append(finding)
    hostname = report.node.get("hostname") or "node"
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for area, findings in sorted(by_area.items()):
        suite = ET.SubElement(suites, "testsuite", name=f"{hostname}.{area}", hostname=str(hostname),
                              timestamp=report.started_at)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for finding in findings:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=finding.check, name=finding.subject, time="0")
            detail = (f"observed: {finding.observed!r}\nexpected: {finding.expected!r}\n"
                      f"why: {finding.reason or ''}")
            if finding.waiver:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"waived until {finding.waiver.expires}: "
                                                       f"{finding.waiver.reason}")
            elif finding.status is Status.FAIL:
                counts["failures"] += 1
                node = ET.SubElement(case, "failure", message=finding.message, type=finding.severity.value)
                node.text = detail
            elif finding.status is Status.UNKNOWN:
                counts["errors"] += 1
                node = ET.SubElement(case, "error", message=finding.message, type="unknown")
                node.text = detail
            elif finding.status is Status.SKIP:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=finding.message)
            elif finding.status is Status.WARN:
                ET.SubElement(case, "system-out").text = f"WARNING: {finding.message}\n{detail}"
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
