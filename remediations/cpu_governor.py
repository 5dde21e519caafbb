"""cpu_governor: scaling_governor of every CPU, refused when cpufreq does not offer it."""

from __future__ import annotations

import re

from agent.core.model import Finding
from agent.sources.host import CPU_DIR
from checks.host_cpu import cpu_ranges  # the audit's own cpulist format
from remediations import Action, ActionClass, AttrWrite, PlanContext, actuator, refused, target_value
from remediations.boot import BOOT_CONF, persist

_CPU_RE = re.compile(r"^cpu\d+$")


def parse_governor(raw: bytes) -> str:
    return raw.decode("utf-8").strip()


def shown_governor(old: bytes, value: str) -> bytes:
    return f"{value}\n".encode()


@actuator("cpu_governor", writes=(f"{CPU_DIR}/cpu*/cpufreq/scaling_governor", BOOT_CONF))
def plan_cpu_governor(finding: Finding, ctx: PlanContext) -> list[Action]:
    action_id = "cpu_governor:node"
    expectation = ctx.profile.expectation("cpu", "governor")
    value = target_value(expectation) if expectation else None
    if expectation is None or value is None:
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed,
                        "the profile names no single governor to set")]
    cpus = sorted((n for n in ctx.target.listdir(CPU_DIR) if _CPU_RE.match(n)), key=lambda n: int(n[3:]))
    changes: list[AttrWrite] = []
    before: dict[str, list[int]] = {}
    for cpu in cpus:
        path = f"{CPU_DIR}/{cpu}/cpufreq/scaling_governor"
        raw = ctx.target.read(path)
        if raw is None:  # offline CPU or no cpufreq driver for it
            continue
        available = ctx.target.read(f"{CPU_DIR}/{cpu}/cpufreq/scaling_available_governors")
        if available is not None and value not in available.decode("utf-8").split():
            return [refused(action_id, finding, ActionClass.SAFE, finding.observed,
                            f"{cpu} offers governors {available.decode().strip()}, not {value}")]
        current = parse_governor(raw)
        before.setdefault(current, []).append(int(cpu[3:]))
        if current != value:
            changes.append(AttrWrite(path, value, parse_governor, shown_governor))
    if not changes:
        return [] if before else [refused(action_id, finding, ActionClass.SAFE, None, "no CPU exposes cpufreq")]
    return [Action(action_id, "cpu_governor", ActionClass.SAFE, "node", finding.check,
                   {g: cpu_ranges(tuple(c)) for g, c in sorted(before.items())}, value,
                   changes=(*changes, persist("cpu.governor", value)), expectation=expectation)]
