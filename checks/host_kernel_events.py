"""host.kernel.events: well-known kernel messages of this boot that an SRE acts on (issue 13).

The catalogue is agent/sources/kernel_events.py: each kind of event (file-handle exhaustion, OOM
kills, hung tasks, lockups, RCU stalls, machine checks and APEI/GHES errors, EDAC, PCIe AER, NVMe
timeouts and resets, block I/O errors in every spelling, filesystem corruption and read-only remounts,
kernel oopses and panics, nvidia-peermem errors, network link drops) has a stable id, a severity, an
action and `limit`, the count since boot that is still normal (per port for link drops: the busiest
port's count is compared, so one drop on each of eight ports is not a flap). One finding per event id seen, keyed by the
id (never per line): how many times, the first and the last line, and up to MAX_EXAMPLES distinct
lines in `observed`. Over its limit an event fails when critical and warns otherwise (info for a
job's own memory-cgroup OOM); at or under it, it passes. No event at all: one pass for the node.

Evidence is this boot's kernel records only, as for `gpu.xid`: the kmsg reader's records (the log is
never read again), cut at the last restart of the since-boot clock, and records whose wall-clock stamp
predates the boot (observation time minus /proc/uptime) dropped and counted. A log without any time
(`dmesg -t`, bare text) is what dmesg holds, the current boot, from its last boot banner on
(`kmsg.boot_start`, issue 31.4): its events count with the catalogue's severity. No kernel log in the
snapshot: nothing (source.available says so); an unreadable one: `unknown`, as `gpu.xid` says it.

Profiles override any event under `expect.kernel_events.<id>`: `{max: N, severity, reason}` and
optionally `action` (`max` is the count since boot that is still normal).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agent.core.expect import Expectation
from agent.core.facts import KernelEvent, KmsgRecord, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.policy.profiles import Profile
from agent.sources.kernel_events import BY_ID, RULES, Rule
from agent.sources.kmsg import boot_time, predates_boot, timeless
from checks import Check

MAX_EXAMPLES = 3  # distinct lines kept per event (besides the count, the first and the last)
MAX_KEYS = 64  # ports (a rule's `per` key) counted one by one per event (an HGX node has about a dozen)
OTHER = "(other)"  # the ports beyond MAX_KEYS, counted together and never judged as one port
LINE_CHARS = 160  # a quoted line is cut to this

_ID_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)*$"
_OVERRIDE = {
    "type": "object", "additionalProperties": False, "required": ["max", "severity", "reason"],
    "properties": {
        "max": {"type": "integer", "minimum": 0, "description": "events since boot that are still normal"},
        "severity": {"$ref": "#/$defs/severity"},
        "reason": {"type": "string", "minLength": 1},
        "action": {"type": "string", "pattern": "^[a-z_]+$"},
    },
}
SCHEMA = {
    "type": ["object", "null"],
    "description": ("Overrides of the built-in kernel event catalogue (agent/sources/kernel_events.py): event id -> "
                    "{max: events since boot that are still normal, severity, reason, action?}; null keeps the "
                    "built-in entry."),
    "propertyNames": {"enum": [rule.id for rule in RULES]},
    "additionalProperties": {"anyOf": [{"type": "null"}, _OVERRIDE]},
}

EVENTS = Check("host.kernel.events", "Kernel fault messages since boot", source="kmsg",
               expect_path=("kernel_events",), schema=SCHEMA,
               evidence=("catalogued kernel messages of this boot's log, counted per event against its limit "
                         "(per port for link drops); per event id severity/action (limit): "
                         + "; ".join(f"{r.id} {r.severity.value}/{r.action}" + (f" ({r.limit})" if r.limit else "")
                                     for r in RULES)))


class _Seen(NamedTuple):
    """One event id's records, bounded: the count, the first and last record, a few distinct lines."""

    times: int
    first: KmsgRecord
    last: KmsgRecord
    examples: tuple[str, ...]
    timed: int = 0  # records with a time (since boot or wall clock); 0: a log without time stamps
    keys: tuple[tuple[str, int], ...] = ()  # per `per` key of the rule (a port): its count, MAX_KEYS at most

    def worst(self) -> int:
        """What the limit is compared with: the node's count, or the busiest key's for a per-key rule."""
        return max((n for k, n in self.keys if k != OTHER), default=self.times)


def _count_key(keys: tuple[tuple[str, int], ...], key: str) -> tuple[tuple[str, int], ...]:
    counts = dict(keys)
    if key not in counts and len(counts) >= MAX_KEYS:
        key = OTHER  # bounded: a log naming thousands of ports keeps 64 by name and only counts the rest
    counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def default_expectation(rule: Rule) -> Expectation:
    return Expectation((("max", rule.limit),), rule.severity, rule.reason, (("action", rule.action),))


def _expectation(rule: Rule, profile: Profile) -> Expectation:
    return profile.expectations_under("kernel_events").get(rule.id) or default_expectation(rule)


def _stamp(record: KmsgRecord) -> str:
    if record.wall:
        return record.wall
    if record.ts_usec is not None:
        return f"[{record.ts_usec / 1e6:.6f}]"
    return "(no time)"


def _quote(record: KmsgRecord) -> str:
    text = record.message if len(record.message) <= LINE_CHARS else record.message[:LINE_CHARS - 3] + "..."
    return f"{_stamp(record)} {text!r}"


def _collect(facts: NodeFacts, events: tuple[KernelEvent, ...]) -> tuple[dict[str, _Seen], int]:
    """Event id -> what was seen of it this boot; and how many matching records predate the boot."""
    uptime = facts.host.uptime_s
    boot = boot_time(facts.observed_at, uptime if isinstance(uptime, (int, float)) else None)
    seen: dict[str, _Seen] = {}
    older = 0
    for event in events:
        record = event.record
        if predates_boot(record.wall, boot, facts.observed_at):
            older += 1
            continue
        line = record.message[:LINE_CHARS]
        timed = 0 if timeless(record) else 1
        was = seen.get(event.rule)
        per_key = bool(BY_ID[event.rule].per)
        if was is None:
            seen[event.rule] = _Seen(1, record, record, (line,), timed,
                                     _count_key((), event.key) if per_key else ())
            continue
        examples = was.examples
        if len(examples) < MAX_EXAMPLES and line not in examples:
            examples = (*examples, line)
        seen[event.rule] = _Seen(was.times + 1, was.first, record, examples, was.timed + timed,
                                 _count_key(was.keys, event.key) if per_key else ())
    return seen, older


@EVENTS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    kmsg = facts.kmsg
    if isinstance(kmsg, Unsupported):
        return []  # no kernel log in this snapshot: source.available says so
    if isinstance(kmsg, Unknown):
        return [EVENTS.finding("node", Status.UNKNOWN, Severity.WARNING, f"kernel log: {kmsg.reason}")]
    events = facts.kernel_events
    if isinstance(events, Unknown):  # parsed with the log (agent.sources.kernel_log): unread with it
        return [EVENTS.finding("node", Status.UNKNOWN, Severity.WARNING, f"kernel log: {events.reason}")]
    seen, older = _collect(facts, events)
    note = f" ({older} such records in the log predate this boot)" if older else ""
    if not seen:
        span = "in the log (no time stamps: the current boot, from its last boot banner)" \
            if kmsg and all(timeless(r) for r in kmsg) else "since boot"
        return [EVENTS.finding("node", Status.PASS, Severity.INFO,
                               f"no catalogued kernel fault message {span}{note}", observed={},
                               expected="no kernel fault messages")]
    findings = []
    for rule in RULES:  # catalogue order: stable, and the worst kinds first
        if rule.id not in seen:
            continue
        findings.append(_finding(rule, seen[rule.id], _expectation(rule, profile), note))
    return findings


def _finding(rule: Rule, seen: _Seen, expectation: Expectation, note: str) -> Finding:
    times = "once" if seen.times == 1 else f"{seen.times} times"
    where = (_quote(seen.first) if seen.times == 1
             else f"first {_quote(seen.first)}, last {_quote(seen.last)}")
    limit = dict(expectation.comparators).get("max", 0)
    each = f" per {rule.per}" if rule.per else ""
    allowed = f" (up to {limit}{each} is normal)" if limit else ""
    observed: dict[str, Any] = {"count": seen.times, "examples": list(seen.examples)}
    if seen.keys:
        observed[rule.per] = dict(seen.keys)
        name, most = max(seen.keys, key=lambda kv: kv[1])
        allowed += f"; most on {rule.per} {name}: {most}"
    verdict = expectation.evaluate(seen.worst())
    untimed = not seen.timed  # a log without time: the current boot's by its grammar (kmsg.boot_start)
    when = (" in a log without time stamps (what dmesg holds: the current boot, from its last boot banner)"
            if untimed else " since boot")
    message = f"{rule.title}: {times}{when}{allowed}; {where}{note}"
    if not verdict.comparable:  # a profile's limit that is not a number
        return EVENTS.finding(rule.id, Status.UNKNOWN, expectation.severity, f"{message}: {verdict.detail}",
                              observed=observed, expected=expectation.expected, reason=expectation.reason)
    if verdict.ok:
        return EVENTS.finding(rule.id, Status.PASS, expectation.severity, message, observed=observed,
                              expected=expectation.expected, reason=expectation.reason)
    severity = expectation.severity
    status = Status.FAIL if severity is Severity.CRITICAL else Status.WARN
    return EVENTS.finding(rule.id, status, severity, message, observed=observed,
                          expected=expectation.expected, reason=expectation.reason,
                          action=str(expectation.option("action", rule.action)))
