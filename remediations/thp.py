"""thp: transparent hugepages `enabled` / `defrag` at runtime through sysfs.

The bootloader is never edited: when the kernel command line already sets
`transparent_hugepage=`, that is the operator's boot-time choice and a
runtime change that contradicts it is refused.
"""

from __future__ import annotations

from agent.core.facts import parse_kernel_cmdline
from agent.core.model import Finding
from agent.sources.host import THP_DIR, parse_bracketed
from remediations import Action, ActionClass, AttrWrite, PlanContext, actuator, refused, target_value
from remediations.boot import BOOT_CONF, persist


def parse_thp(raw: bytes) -> str:
    return parse_bracketed(raw.decode("utf-8"))


def thp_choices(raw: bytes) -> list[str]:
    return [word.strip("[]") for word in raw.decode("utf-8").split()]


def shown_thp(old: bytes, value: str) -> bytes:
    """'[always] madvise never' + 'never' -> 'always madvise [never]'."""
    words = [w.strip("[]") for w in old.decode("utf-8").split()]
    return (" ".join(f"[{w}]" if w == value else w for w in words) + "\n").encode()


@actuator("thp", writes=(f"{THP_DIR}/enabled", f"{THP_DIR}/defrag", BOOT_CONF))
def plan_thp(finding: Finding, ctx: PlanContext) -> list[Action]:
    which = finding.check.rsplit(".", 1)[-1]  # host.thp.enabled | host.thp.defrag
    action_id = f"thp:{which}"
    expectation = ctx.profile.expectation("thp", which)
    path = f"{THP_DIR}/{which}"
    raw = ctx.target.read(path) if which in ("enabled", "defrag") else None
    if expectation is None or raw is None:
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed,
                        f"{path} does not exist (kernel without THP)" if expectation else "not in the profile")]
    current = parse_thp(raw)
    value = target_value(expectation)
    if value is None or value not in thp_choices(raw):
        return [refused(action_id, finding, ActionClass.SAFE, current,
                        f"this kernel offers {', '.join(thp_choices(raw))}; the profile asks for "
                        f"{expectation.describe()}")]
    if expectation.evaluate(current).ok:
        return []
    if which == "enabled":
        cmdline_raw = ctx.target.read("/proc/cmdline")
        boot = parse_kernel_cmdline(cmdline_raw.decode("utf-8", "replace")) if cmdline_raw else {}
        on_cmdline = boot.get("transparent_hugepage")
        if on_cmdline is not None and not expectation.evaluate(on_cmdline).ok:
            return [refused(action_id, finding, ActionClass.SAFE, current,
                            f"the kernel command line sets transparent_hugepage={on_cmdline}; change it in "
                            "the bootloader configuration (nodewarden never edits the bootloader)")]
    return [Action(action_id, "thp", ActionClass.SAFE, which, finding.check, current, value,
                   changes=(AttrWrite(path, value, parse_thp, shown_thp), persist(f"thp.{which}", value)),
                   expectation=expectation)]
