"""history.counters: the growth of a GPU's monotonic counters over a window, not their totals (issue 33.3).

The rules are the profile's `expect.counters.<name>` (agent.core.counters): the counters summed, the
window and the largest increase allowed. Evidence is the ledger's daily samples (the day's last
reading per board and counter, keyed by serial, else UUID) plus today's; a counter that went down was
reset and counts from zero, never as negative growth (the finding says how many resets it saw).

One finding per GPU NVML reads now, subject `gpuN`. A board with fewer than two samples has no rate
yet: `skip` saying so, never a pass it has not earned and never a failure. Without a ledger the check
does not run (the `ledger` source is not configured).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from agent.core.counters import COUNTERS, CounterFiring, CounterRule, evaluate_counter_rules, parse_counter_rules
from agent.core.facts import NodeFacts
from agent.core.facts_nvml import NvmlFacts
from agent.core.history import History
from agent.core.history_rules import RULE_NAME
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile
from checks import Check

_RULE = {
    "type": "object", "additionalProperties": False,
    "required": ["window", "max_increase", "severity", "reason"],
    "properties": {
        "counter": {"enum": sorted(COUNTERS)},
        "counters": {"type": "array", "items": {"enum": sorted(COUNTERS)}, "minItems": 1, "maxItems": 16,
                     "description": "summed: remapped rows are correctable + uncorrectable"},
        "window": {"type": "string", "pattern": "^[1-9][0-9]{0,5}[smhdw]$", "description": "e.g. 24h, 7d"},
        "max_increase": {"type": "integer", "minimum": 0, "maximum": 1 << 40,
                         "description": "the largest growth within the window that is fine"},
        "severity": {"$ref": "#/$defs/severity"},
        "action": {"type": "string", "pattern": "^[a-z_]+$"},
        "reason": {"type": "string", "minLength": 1},
    },
    "oneOf": [{"required": ["counter"]}, {"required": ["counters"]}],
}
SCHEMA = {
    "type": ["object", "null"],
    "description": ("Growth limits for GPU counters from the ledger's daily samples: name -> {counter | counters, "
                    "window, max_increase, severity, action?, reason}; null removes an inherited rule. Counters: "
                    + ", ".join(sorted(COUNTERS)) + "."),
    "propertyNames": {"pattern": RULE_NAME},
    "additionalProperties": {"anyOf": [{"type": "null"}, _RULE]},
}

COUNTERS_CHECK = Check(
    "history.counters", "GPU counters growing too fast (ledger)", source="ledger", optional_reads=("nvml",),
    expect_path=("counters",), schema=SCHEMA, parts=("nvml",),
    evidence=("the ledger's daily samples of each GPU's monotonic counters (row remaps, aggregate ECC, retired "
              "pages, PCIe replays, NVLink recovery/replay/CRC) by serial; growth within each rule's window, "
              "resets counted from zero (profile expect.counters)"))

_SEVERITY = {"info": Severity.INFO, "warning": Severity.WARNING, "critical": Severity.CRITICAL}
_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def counter_rules_of(profile: Profile) -> list[CounterRule]:
    return parse_counter_rules(profile.section(*COUNTERS_CHECK.expect_path))


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _observed(firing: CounterFiring) -> dict[str, Any]:
    return {"rule": firing.rule.name, "counters": list(firing.rule.counters), "increase": firing.increase,
            "window": firing.rule.window, "max_increase": firing.rule.max_increase, "first": _when(firing.since),
            "last": _when(firing.until), "resets": firing.resets, "key": firing.key}


def _text(firing: CounterFiring) -> str:
    resets = f", {firing.resets} reset{'s' if firing.resets != 1 else ''} counted from zero" if firing.resets else ""
    return (f"{firing.rule.name}: {' + '.join(firing.rule.counters)} up {firing.increase} in {firing.rule.window} "
            f"(at most {firing.rule.max_increase}), from {_when(firing.since)} to {_when(firing.until)}{resets}")


@COUNTERS_CHECK.evaluator
def evaluate_counters(facts: NodeFacts, profile: Profile) -> list[Finding]:
    rules = counter_rules_of(profile)
    history = getattr(facts, "history", None)
    if not rules or not isinstance(history, History) or not isinstance(facts.nvml, NvmlFacts):
        return []
    firings, judged = evaluate_counter_rules(rules, history.samples, history.until)
    findings = []
    for gpu in facts.nvml.gpus:
        keys = [k for k in (gpu.serial, gpu.uuid) if isinstance(k, str) and k]
        key = next((k for k in keys if k in judged), keys[0] if keys else "")
        subject = f"gpu{gpu.index}"
        mine = [f for f in firings if f.key == key]
        if mine:
            worst = max(mine, key=lambda f: _RANK[_SEVERITY[f.rule.severity]])
            severity = _SEVERITY[worst.rule.severity]
            findings.append(COUNTERS_CHECK.finding(
                subject, Status.FAIL if severity is not Severity.INFO else Status.WARN, severity,
                "; ".join(_text(f) for f in mine), observed=[_observed(f) for f in mine],
                expected=", ".join(f"{f.rule.name} <= {f.rule.max_increase} in {f.rule.window}" for f in mine),
                reason=worst.rule.reason, action=worst.rule.action))
        elif key in judged:
            findings.append(COUNTERS_CHECK.finding(subject, Status.PASS, Severity.INFO,
                                                   f"counters within limits ({', '.join(sorted(judged[key]))})"))
        else:
            findings.append(COUNTERS_CHECK.finding(
                subject, Status.SKIP, Severity.INFO,
                "no rate yet: the ledger holds fewer than two daily samples of this board's counters"
                if key else "the GPU reports neither serial nor UUID: its counters cannot be followed"))
    return findings
