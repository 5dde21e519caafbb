"""host.kernel.cmdline: kernel parameters the profile asks for (e.g. iommu=pt)."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check, keyed_schema

CMDLINE = Check("host.kernel.cmdline", "Kernel command line", source="host", action="reboot",
                expect_path=("kernel_cmdline",),
                schema=keyed_schema("Kernel parameter -> expectation on its value ('present' for a bare flag).",
                                    r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"),
                evidence="/proc/cmdline values (present for a bare flag, absent when missing)", parts=("cmdline",))


@CMDLINE.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectations = profile.expectations_under("kernel_cmdline")
    if not expectations:
        return []
    params = facts.host.kernel_params
    findings = []
    for name, expectation in sorted(expectations.items()):
        observed: object
        if isinstance(params, Unknown):
            observed = params
        elif name not in params:
            observed = "absent"
        else:
            value = params[name]
            observed = "present" if value is None else value
        findings.append(CMDLINE.compare(name, expectation, observed, f"kernel parameter {name}"))
    return findings
