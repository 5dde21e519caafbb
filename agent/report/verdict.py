"""The node's verdict: DRAIN, DEGRADED or OK, and what to do. The one rule every consumer shares.

The table prints it first, the JSON report carries it (`verdict`, `actions`), the Prometheus output
and the daemon export it (`nodewarden_verdict`), and `health-check` acts on it. So it is declared
once, here:

- DRAIN: a finding that is not waived fails with severity critical and asks for an action that
  takes the node out of service (DRAIN_ACTIONS: drain, a GPU/fabric reset, a reboot, a part to
  replace or reseat, support, cooling, a link, the fabric manager), or a source the node needs
  (host, NVML on a GPU node) is down (`source.available` fails critical). Positive evidence only:
  an `unknown` never drains.
- DEGRADED: anything else fails, or warns with severity warning or critical. Tuning drift (a
  sysctl, THP, a BIOS attribute, old firmware) lands here however it is rated: it never drains.
- OK: nothing fails (passes, skips, waived findings, `info` warnings).

Below it, the actions the findings ask for (their `action`; `remediate` where `nodewarden
remediate` fixes it; `review` where neither is known), worst first: by the worst finding asking
(status, then severity), then drain, reboot, GPU and fabric resets before the rest. Each line
names the findings and the worst one's message. Findings that could not be judged (`unknown`)
do not change the verdict and are listed last, as `not judged`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.core.model import Finding, Severity, Status
from agent.core.names import compress, natural_key
from agent.core.sanitise import clean
from agent.report.collapse import rank
from agent.report.fit import row, wrap
from agent.report.gpu_identity import GpuIdentity, gpu_of

OK, DEGRADED, DRAIN = "OK", "DEGRADED", "DRAIN"
VERDICTS = (OK, DEGRADED, DRAIN)  # in order of badness
# Actions that mean the node cannot run jobs as it is: a critical failure asking for one drains.
DRAIN_ACTIONS = frozenset({
    "drain", "reset_gpu", "reset_fabric", "reboot", "contact_support", "reseat", "reseat_or_contact_support",
    "check_cooling", "check_link", "check_cabling", "start_fabric_manager", "inspect_hardware", "field_diagnostics",
})
DRAIN_ACTION_PREFIXES = ("replace_",)  # replace_psu, replace_fan, replace_gpu, ...
REMEDIATE, REVIEW, NOT_JUDGED = "remediate", "review", "not judged"
_FIRST = {"drain": 0, "reboot": 1, "reset_gpu": 2, "reset_fabric": 3}
_LAST = {REMEDIATE: 1, REVIEW: 2, "monitor": 3}
_COLORS = {OK: "green", DEGRADED: "yellow", DRAIN: "red"}
MAX_ITEMS = 3  # findings named per action; the rest are counted


@dataclass
class Ask:
    action: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def worst(self) -> Finding:
        return min(self.findings, key=rank)


@dataclass
class Verdict:
    state: str
    asks: list[Ask]


def action_of(finding: Finding) -> str:
    if finding.status is Status.UNKNOWN:
        return NOT_JUDGED
    return finding.action or (REMEDIATE if finding.remediation else REVIEW)


def drains(finding: Finding) -> bool:
    """True when this finding alone takes the node out of service (see the module's rule)."""
    if finding.waiver is not None or finding.status is not Status.FAIL or finding.severity is not Severity.CRITICAL:
        return False
    if finding.check == "source.available":  # critical only for a source the node needs (checks/sources.py)
        return True
    action = finding.action or ""
    return action in DRAIN_ACTIONS or action.startswith(DRAIN_ACTION_PREFIXES)


def judge(findings: list[Finding]) -> Verdict:
    live = [f for f in findings if f.waiver is None and f.status in (Status.FAIL, Status.WARN, Status.UNKNOWN)]
    state = OK
    if any(f.status is Status.FAIL or (f.status is Status.WARN and f.severity is not Severity.INFO) for f in live):
        state = DEGRADED
    if any(drains(f) for f in live):
        state = DRAIN
    asks: dict[str, Ask] = {}
    for finding in live:
        asks.setdefault(action_of(finding), Ask(action_of(finding))).findings.append(finding)
    ordered = sorted(asks.values(), key=lambda a: (a.action == NOT_JUDGED, rank(a.worst),
                                                    _FIRST.get(a.action, len(_FIRST)), _LAST.get(a.action, 0),
                                                    a.action))
    return Verdict(state, ordered)


def _items(ask: Ask, subjects: dict[int, str]) -> str:
    """`gpu.lost gpu7; gpu.xid gpu7`: worst first, a check's subjects said once, `node` left out.

    At most MAX_ITEMS subjects are named, the others counted: a name is never cut.
    """
    by_check: dict[str, list[str]] = {}
    for finding in sorted(ask.findings, key=lambda f: (rank(f), f.check, natural_key(f.subject))):
        by_check.setdefault(finding.check, []).append(subjects.get(id(finding), finding.subject))
    parts: list[str] = []
    named = left = 0
    for check, subject_names in by_check.items():
        said = compress(subject_names) if len(set(subject_names)) == len(subject_names) else None
        names = [said] if said else subject_names
        if named >= MAX_ITEMS:
            left += len(names)
            continue
        take = names[: MAX_ITEMS - named]
        named += len(take)
        left += len(names) - len(take)
        shown = [n for n in take if n != "node"]
        parts.append(clean(check) + (" " + ", ".join(clean(n) for n in shown) if shown else ""))
    return "; ".join(parts) + (f" and {left} more" if left else "")


def verdict_json(findings: list[Finding], gpus: dict[str, GpuIdentity] | None = None) -> dict[str, Any]:
    """`verdict` and `actions` of the JSON report: the actions asked for, worst first, unjudged left out.

    Each action's `gpus`: the identities (`gpus`, agent.report.gpu_identity) of its GPU subjects."""
    verdict = judge(findings)
    actions = []
    for ask in verdict.asks:
        if ask.action == NOT_JUDGED:
            continue
        ordered = sorted(ask.findings, key=lambda f: (rank(f), f.check, natural_key(f.subject)))
        subjects = list(dict.fromkeys(f.subject for f in ordered))
        named = [gpu_of(s, gpus or {}) for s in subjects]
        actions.append({
            "action": ask.action,
            "severity": ask.worst.severity.value,
            "drains": any(drains(f) for f in ask.findings),
            "checks": list(dict.fromkeys(f.check for f in ordered)),
            "subjects": subjects,
            "gpus": [g for g in named if g is not None],
            "message": ask.worst.message,
        })
    return {"verdict": verdict.state, "actions": actions}


def render_verdict(findings: list[Finding], subjects: dict[int, str], *, width: int, verbose: bool,
                   color: bool) -> list[str]:
    import click  # only the table colours it

    verdict = judge(findings)
    word = click.style(verdict.state, fg=_COLORS[verdict.state], bold=True) if color else verdict.state
    real = [a for a in verdict.asks if a.action != NOT_JUDGED]
    if not verdict.asks:
        return [f"{word}: nothing to do"]
    head = (f"{word}: {len(real)} action{'' if len(real) == 1 else 's'} asked for, worst first" if real
            else f"{word}: nothing fails; what could not be judged")
    lines = wrap(head, width, "  ")
    column = max(len(clean(a.action)) for a in verdict.asks)  # actions can come from a profile's Xid table
    indent = " " * (2 + column + 2)
    for ask in verdict.asks:
        worst = ask.worst
        head = f"  {clean(ask.action):<{column}}  {worst.severity.value:<8} {_items(ask, subjects)}: "
        # the names wrap, never cut; the message is cut to the line (wraps with -v)
        lines += row(head, clean(worst.message), width, indent, verbose)
    return lines
