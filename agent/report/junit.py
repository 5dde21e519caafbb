"""JUnit XML: one testsuite per area, one testcase per finding.

fail -> <failure>, unknown -> <error> (the check could not run), skip and
waived -> <skipped>, warn -> passes with the message in <system-out>. A finding of
an imported snapshot names its inputs in the testcase's <properties> (`evidence`); a GPU's
finding names the GPU there (`gpu.uuid`, `gpu.pci_bus_id`, `gpu.serial`: agent.report.gpu_identity).
Every text is cleaned (`agent.core.sanitise`): XML 1.0 cannot hold NUL, ESC and
most other control characters even escaped, so one would make the file unreadable.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent.core.model import Finding, Status
from agent.core.sanitise import clean
from agent.report.gpu_identity import gpu_identities, gpu_of
from agent.report.model import Report


def render_junit(report: Report) -> str:
    suites = ET.Element("testsuites", name="nodewarden", time=f"{report.duration_s:.3f}")
    by_area: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_area.setdefault(finding.check.split(".", 1)[0], []).append(finding)
    hostname = clean(str(report.node.get("hostname") or "node"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    gpus = gpu_identities(report.facts)
    for area, findings in sorted(by_area.items()):
        suite = ET.SubElement(suites, "testsuite", name=clean(f"{hostname}.{area}"), hostname=hostname,
                              timestamp=clean(report.started_at))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for finding in findings:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=clean(finding.check), name=clean(finding.subject),
                                 time="0")
            gpu = gpu_of(finding.subject, gpus) or {}
            named = [(f"gpu.{key}", str(gpu[key])) for key in ("uuid", "pci_bus_id", "serial") if key in gpu]
            if finding.evidence or named:
                properties = ET.SubElement(case, "properties")
                for prop, text in named:  # which GPU, for a per-device consumer
                    ET.SubElement(properties, "property", name=prop, value=clean(text))
                for ref in finding.evidence or ():  # an imported snapshot: the inputs of this finding's facts
                    ET.SubElement(properties, "property", name="evidence", value=clean(
                        f"{ref.describe()} [{ref.kind}]"))
            detail = (f"observed: {clean(repr(finding.observed))}\nexpected: {clean(repr(finding.expected))}\n"
                      f"why: {clean(finding.reason or '')}")
            message = clean(finding.message)
            if finding.waiver:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=clean(f"waived until {finding.waiver.expires}: "
                                                             f"{finding.waiver.reason}"))
            elif finding.status is Status.FAIL:
                counts["failures"] += 1
                node = ET.SubElement(case, "failure", message=message, type=finding.severity.value)
                node.text = detail
            elif finding.status is Status.UNKNOWN:
                counts["errors"] += 1
                node = ET.SubElement(case, "error", message=message, type="unknown")
                node.text = detail
            elif finding.status is Status.SKIP:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=message)
            elif finding.status is Status.WARN:
                ET.SubElement(case, "system-out").text = f"WARNING: {message}\n{detail}"
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
