"""history.gpu and history.node: a fault that keeps coming back, judged as the pattern it is (issue 33.2).

The rules are the profile's `expect.history.<name>` (agent.core.history_rules): count the ledger's
incidents of some kinds (and codes) within a window, per GPU or for the node, and fire at a count.
Evidence is the node's ledger only (agent.state.ledger, read by the engine into `facts.history`);
without one the checks do not run (the `ledger` source is not configured), and an unreadable one is
`source.available` saying so: history never makes an audit fail by being absent.

* history.gpu: one finding per GPU NVML reads now, subject `gpuN`, naming every rule met on that board
  (found by serial, else UUID: the count follows the board, and a new board in the slot starts clean).
  A rule met by a board that is no longer in the node is not this node's fault any more: not reported
  here (`nodewarden ledger show --gpu SERIAL` still finds it).
* history.node: one finding per node-wide rule, subject the rule's name.

A finding says the count, the window and the first and last time; a sticky rule says since when it
has held and how to clear it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from agent.core.facts import NodeFacts
from agent.core.facts_nvml import NvmlFacts
from agent.core.history import KINDS, GpuRef, History
from agent.core.history_rules import RULE_NAME, SCOPES, Firing, Rule, evaluate_rules, parse_rules
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile
from checks import Check

_KIND_ENUM = [k for k in KINDS if k not in ("rule", "clear")]  # a rule's memory and a clear are the ledger's own
_RULE = {
    "type": "object", "additionalProperties": False,
    "required": ["window", "count", "severity", "reason"],
    "properties": {
        "kind": {"enum": _KIND_ENUM},
        "kinds": {"type": "array", "items": {"enum": _KIND_ENUM}, "minItems": 1, "maxItems": 16},
        "codes": {"type": "array", "items": {"type": ["string", "integer"]}, "maxItems": 256,
                  "description": "only these codes (Xid numbers, kernel event ids); absent: any"},
        "incident_severity": {"enum": ["info", "warning", "critical"],
                              "description": "only incidents recorded with this severity (critical Xids: fatal ones)"},
        "scope": {"enum": list(SCOPES), "description": "count per GPU (by serial, else UUID) or for the node"},
        "window": {"type": "string", "pattern": "^[1-9][0-9]{0,5}[smhdw]$", "description": "e.g. 24h, 7d"},
        "count": {"type": "integer", "minimum": 1, "maximum": 100000},
        "per_code": {"type": "boolean", "description": "count each code apart (the same Xid)"},
        "distinct_boots": {"type": "boolean", "description": "count the boots it was seen in, not the incidents"},
        "sticky": {"type": "boolean", "description": "stays until `nodewarden ledger clear --rule NAME`"},
        "severity": {"$ref": "#/$defs/severity"},
        "action": {"type": "string", "pattern": "^[a-z_]+$"},
        "reason": {"type": "string", "minLength": 1},
    },
    "oneOf": [{"required": ["kind"]}, {"required": ["kinds"]}],
}
SCHEMA = {
    "type": ["object", "null"],
    "description": ("Windowed rules over the node's ledger: name -> {kind | kinds, codes?, incident_severity?, "
                    "scope: gpu | node, window, count, per_code?, distinct_boots?, sticky?, severity, action?, "
                    "reason}; null removes an inherited rule."),
    "propertyNames": {"pattern": RULE_NAME},
    "additionalProperties": {"anyOf": [{"type": "null"}, _RULE]},
}

GPU = Check("history.gpu", "Faults that recur on one GPU (ledger)", source="ledger", optional_reads=("nvml",),
            expect_path=("history",), schema=SCHEMA, parts=("nvml",),
            evidence=("the node's ledger of incidents (Xids, SXids, kernel events, drains, remediations) counted "
                      "per GPU serial (else UUID) within each rule's window (profile expect.history)"))
NODE = Check("history.node", "Faults and actions that recur on the node (ledger)", source="ledger",
             expect_path=("history",), parts=("subject",),
             evidence="the node's ledger of incidents counted within each node-wide rule's window (expect.history)")


def rules_of(profile: Profile) -> list[Rule]:
    return parse_rules(profile.section(*GPU.expect_path))


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _text(firing: Firing) -> str:
    rule = firing.rule
    code = f" {firing.code}" if firing.code else (f" ({', '.join(firing.codes[:4])})" if firing.codes else "")
    if firing.seen == 0 and firing.sticky_since is not None:
        return (f"{rule.name}: held since {_when(firing.sticky_since)} (sticky; "
                f"`nodewarden ledger clear --rule {rule.name}` when dealt with)")
    text = (f"{rule.name}: {'/'.join(rule.kinds)}{code} {firing.seen} {firing.rule.counted} in {rule.window} "
            f"(limit {rule.limit}), first {_when(firing.first)}, last {_when(firing.last)}")
    return text + (" (sticky)" if rule.sticky else "")


def _observed(firing: Firing) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": firing.rule.name, "count": firing.seen, "counted": firing.rule.counted,
                           "window": firing.rule.window, "limit": firing.rule.limit, "first": _when(firing.first),
                           "last": _when(firing.last), "codes": list(firing.codes[:16]), "key": firing.key}
    if firing.rule.sticky:
        out["sticky"] = True
        out["memory"] = firing.memory_key
        if firing.sticky_since is not None:
            out["since"] = _when(firing.sticky_since)
    return out


_SEVERITY = {"info": Severity.INFO, "warning": Severity.WARNING, "critical": Severity.CRITICAL}
_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


BY_SLOT = (" (counted by slot: an imported log of several boots cannot tell whether the board in it changed, "
           "so at most a warning; compare the GPU's serial with the node's repair history)")


def _fail(check: Check, subject: str, firings: list[Firing], label: str | None = None, *,
          by_slot: bool = False) -> Finding:
    worst = max(firings, key=lambda f: _RANK[_SEVERITY[f.rule.severity]])
    severity = _SEVERITY[worst.rule.severity]
    if by_slot and severity is Severity.CRITICAL:
        severity = Severity.WARNING  # the same slot is not proof of the same board: never a critical
    return check.finding(subject, Status.FAIL if severity is not Severity.INFO else Status.WARN, severity,
                         "; ".join(_text(f) for f in firings) + (BY_SLOT if by_slot else ""),
                         observed=[_observed(f) for f in firings],
                         expected=", ".join(f"{f.rule.name} < {f.rule.limit} in {f.rule.window}" for f in firings),
                         reason=worst.rule.reason, action=worst.rule.action, label=label)


def _history(facts: NodeFacts) -> History | None:
    history = getattr(facts, "history", None)
    return history if isinstance(history, History) else None


@GPU.evaluator
def evaluate_gpus(facts: NodeFacts, profile: Profile) -> list[Finding]:
    rules = [r for r in rules_of(profile) if r.scope == "gpu"]
    history = _history(facts)
    if not rules or history is None or not isinstance(facts.nvml, NvmlFacts):
        return []  # no GPU is named without NVML: counting an unnamed slot would judge the wrong board
    firings = evaluate_rules(rules, history.incidents, history.until)
    findings = []
    for gpu in facts.nvml.gpus:
        ref = GpuRef(gpu.index, gpu.uuid if isinstance(gpu.uuid, str) else "",
                     gpu.serial if isinstance(gpu.serial, str) else "")
        keys = {k for k in (ref.serial, ref.uuid) if k}
        mine = [f for f in firings if f.key in keys]
        slot = [f for f in firings if f.key == f"index:{gpu.index}"]  # a log's history (engine.history.LogHistory)
        subject = f"gpu{gpu.index}"
        if mine:
            findings.append(_fail(GPU, subject, mine))
        elif slot:
            findings.append(_fail(GPU, subject, slot, by_slot=True))
        else:
            findings.append(GPU.finding(subject, Status.PASS, Severity.INFO,
                                        f"no history rule met ({len(rules)} rules)"))
    return findings


@NODE.evaluator
def evaluate_node(facts: NodeFacts, profile: Profile) -> list[Finding]:
    rules = [r for r in rules_of(profile) if r.scope == "node"]
    history = _history(facts)
    if not rules or history is None:
        return []
    firings = evaluate_rules(rules, history.incidents, history.until)
    findings = []
    for rule in rules:
        mine = [f for f in firings if f.rule.name == rule.name]
        if mine:
            findings.append(_fail(NODE, rule.name, mine))
        else:
            findings.append(NODE.finding(rule.name, Status.PASS, Severity.INFO,
                                         f"{rule.name}: under {rule.limit} {rule.counted} in {rule.window}"))
    return findings
