"""host.modules: kernel modules that must (or must not) be loaded."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check, keyed_schema

MODULES = Check("host.modules", "Kernel modules", source="host", action="load_module", expect_path=("modules",),
                schema=keyed_schema("Kernel module -> expectation on 'loaded' | 'absent'.", r"^[a-z0-9_]+$"),
                evidence="loaded or absent in /proc/modules", parts=("modules",))


@MODULES.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    modules = facts.host.modules
    findings = []
    for name, expectation in sorted(profile.expectations_under("modules").items()):
        observed: str | Unknown
        if isinstance(modules, Unknown):
            observed = modules
        elif name in modules:
            state = modules[name]
            observed = "loaded" if state == "Live" else state.lower()
        else:
            observed = "absent"
        findings.append(MODULES.compare(name, expectation, observed, f"module {name}"))
    return findings
