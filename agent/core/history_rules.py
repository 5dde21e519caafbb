"""Windowed rules over a node's history (issue 33.2): `count(kind/code, scope, window) >= n`.

A rule (profile `expect.history.<name>`) counts the incidents of its kinds (and codes, and incident
severity) within its window, per GPU (scope gpu: by serial, else UUID, so the count follows the
board) or for the node, optionally per code ("the same Xid") and optionally counting distinct boots
instead of incidents ("after two reboots" = seen in three boots). It fires at `count` or more.
A sticky rule stays fired after its window has passed, until an operator clears it
(`nodewarden ledger clear`, itself an incident of kind `clear`): the engine records a `rule`
incident when a sticky rule first fires, and that incident is the rule's memory.

Pure: incidents in, firings out. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from agent.core.history import KINDS, Incident
from agent.core.windows import window_seconds

SCOPES = ("gpu", "node")
RULE_NAME = r"^[a-z][a-z0-9_]{0,63}$"


class Rule(NamedTuple):
    name: str
    kinds: tuple[str, ...]
    window: str
    window_s: float
    limit: int  # fires at this count or more (the profile's `count`)
    severity: str
    action: str
    reason: str
    scope: str = "node"
    codes: tuple[str, ...] = ()  # empty: any code
    incident_severity: str = ""  # only incidents recorded with this severity ("critical": fatal Xids)
    per_code: bool = False  # count each code apart ("the same Xid")
    distinct_boots: bool = False  # count the boots it was seen in, not the incidents
    sticky: bool = False

    def wants(self, incident: Incident) -> bool:
        return (incident.kind in self.kinds and (not self.codes or incident.code in self.codes)
                and (not self.incident_severity or incident.severity == self.incident_severity))

    @property
    def counted(self) -> str:
        return "boots" if self.distinct_boots else "times"


def parse_rules(section: Mapping[str, Any]) -> list[Rule]:
    """The rules of a profile's `expect.history` (schema-checked already; null entries are removed rules)."""
    rules = []
    for name, body in sorted(section.items()):
        if not isinstance(body, Mapping):
            continue
        kinds = body.get("kinds") or [body.get("kind")]
        rules.append(Rule(
            name=str(name), kinds=tuple(str(k) for k in kinds if k in KINDS), window=str(body["window"]),
            window_s=window_seconds(str(body["window"])), limit=int(body["count"]),
            severity=str(body["severity"]), action=str(body.get("action") or "review"),
            reason=str(body["reason"]), scope=str(body.get("scope") or "node"),
            codes=tuple(str(c) for c in body.get("codes") or ()),
            incident_severity=str(body.get("incident_severity") or ""),
            per_code=bool(body.get("per_code")), distinct_boots=bool(body.get("distinct_boots")),
            sticky=bool(body.get("sticky"))))
    return rules


class Firing(NamedTuple):
    """A rule met for one key (a GPU's serial/UUID or "" for the node), with its evidence."""

    rule: Rule
    key: str  # GpuRef.key for scope gpu, "" for the node
    code: str  # the code counted, with per_code; "" otherwise
    seen: int  # incidents (or boots) in the window
    first: float  # the first and last incident counted (Unix seconds)
    last: float
    codes: tuple[str, ...]  # the codes seen among them
    sticky_since: float | None = None  # fired earlier and not cleared since (sticky rules)

    @property
    def memory_key(self) -> str:
        """The subject of this firing's `rule` incident: "KEY|CODE" ("|" for a node-wide rule)."""
        return memory_key(self.key, self.code)


def memory_key(key: str, code: str) -> str:
    return f"{key}|{code}"


def _clears(clear: Incident, rule: Rule, key: str, code: str) -> bool:
    """Whether a `clear` incident is for this rule and group: all of it ("*"), this GPU, or exactly it."""
    return clear.code == rule.name and clear.subject in ("*", key or "*", memory_key(key, code))


def evaluate_rules(rules: Iterable[Rule], incidents: Iterable[Incident], until: float) -> list[Firing]:
    """Every rule met at time `until` over `incidents` (any order; outside a rule's window ignored)."""
    incidents = tuple(incidents)
    clears = [i for i in incidents if i.kind == "clear"]
    memories = [i for i in incidents if i.kind == "rule"]
    out: list[Firing] = []
    for rule in rules:
        start = until - rule.window_s
        groups: dict[tuple[str, str], list[Incident]] = {}
        for incident in incidents:
            if not (start <= incident.ts <= until) or not rule.wants(incident):
                continue
            key = incident.scope_key(rule.scope)
            if rule.scope == "gpu" and not key:
                continue  # an Xid on a GPU nobody could name is not counted against any board
            groups.setdefault((key, incident.code if rule.per_code else ""), []).append(incident)
        fired: dict[tuple[str, str], Firing] = {}
        for (key, code), seen in groups.items():
            last_clear = max((c.ts for c in clears if _clears(c, rule, key, code)), default=None)
            counted = [i for i in seen if last_clear is None or i.ts > last_clear]  # a clear starts the count again
            n = len({i.boot_id for i in counted if i.boot_id}) if rule.distinct_boots else len(counted)
            if counted and n >= rule.limit:
                fired[(key, code)] = Firing(rule, key, code, n, min(i.ts for i in counted),
                                            max(i.ts for i in counted), tuple(sorted({i.code for i in counted})))
        if rule.sticky:
            for memory in memories:
                if memory.code != rule.name or memory.ts > until or "|" not in memory.subject:
                    continue
                key, _, code = memory.subject.partition("|")
                if any(_clears(c, rule, key, code) and c.ts >= memory.ts for c in clears):
                    continue
                current = fired.get((key, code))
                if current is None:
                    fired[(key, code)] = Firing(rule, key, code, 0, memory.ts, memory.ts, (), memory.ts)
                elif current.sticky_since is None or memory.ts < current.sticky_since:
                    fired[(key, code)] = current._replace(sticky_since=memory.ts)
        out.extend(fired[k] for k in sorted(fired))
    return out
