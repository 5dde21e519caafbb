"""What a health-check decides on: the node's verdict (agent.report.verdict's one rule), where it came
from, and its worst finding as a short, clean line (a Slurm reason, an NPD message).

The same summary travels through the daemon's state file and the one-shot audit's pipe, so both are
parsed here with the same bounds: whatever is read back is hostile input (type, length, count).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.report.gpu_identity import GpuIdentity, gpu_identities
from agent.report.model import Report
from agent.report.verdict import VERDICTS, drains, verdict_json

SUMMARY_SCHEMA = "nodewarden.health/v1"
MAX_ACTIONS = 32
MAX_TEXT = 200  # characters of a message or name kept from a summary
MAX_ITEMS = 16  # checks/subjects kept per action
MAX_GPUS = 64
MAX_TRAIL_GPUS = 8  # GPU identities per decision: a trail line stays well under its 2 KB
MAX_RESULTS = 4096  # (check, subject) results kept per summary: 8 GPUs x a few hundred checks fit
DRAINS, DEGRADES = "drains", "degrades"  # what a result's finding does to the verdict
GPU_FIELDS = ("uuid", "pci_bus_id", "serial", "source")
_UNSAFE = re.compile(r"[^A-Za-z0-9 .,:;_()/#%+@=\[\]<>~-]")  # what a Slurm reason and a log line may carry


@dataclass(frozen=True)
class Answer:
    """The node's verdict, or None when it cannot be decided (`why` says so)."""

    verdict: str | None
    how: str  # "state file", "one-shot audit"
    why: str = ""
    actions: list[dict[str, Any]] = field(default_factory=list)
    gpus: dict[str, str] = field(default_factory=dict)  # subject -> GPU UUID, where one is known
    age_s: float | None = None
    # (check, subject) -> (status, DRAINS/DEGRADES/""): every finding, so a resume can ask whether
    # each cause of the drain came back `pass` (a summary from before it has none: nothing resumes)
    results: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def causes(self, degraded_drains: bool) -> tuple[tuple[str, str], ...]:
        """The (check, subject) of each finding that makes this verdict drain: the draining ones, or,
        where DEGRADED drains (`degraded_drains`) and none does, the ones that degrade it."""
        draining = [key for key, (_, weight) in self.results.items() if weight == DRAINS]
        if not draining and degraded_drains:
            draining = [key for key, (_, weight) in self.results.items() if weight == DEGRADES]
        return tuple(draining)

    def undecided(self, causes: tuple[tuple[str, str], ...]) -> list[str]:
        """Each cause that did not come back `pass`, said as `check subject: status` (absent included)."""
        return [f"{check} {subject}: {self.results.get((check, subject), ('absent', ''))[0]}"
                for check, subject in causes if self.results.get((check, subject), ("", ""))[0] != "pass"]

    def worst(self, limit: int = 120) -> str:
        """The worst finding, short: `gpu.lost gpu7: GPU 7 has fallen off the bus`."""
        if not self.actions:
            return self.verdict or "unknown"
        ask = next((a for a in self.actions if a.get("drains")), self.actions[0])
        subjects = [s for s in ask["subjects"][:2] if s != "node"]
        head = " ".join([ask["checks"][0], *subjects]) if ask["checks"] else ask["action"]
        return short(f"{head}: {ask['message']}" if ask["message"] else head, limit)

    def drained_gpus(self) -> list[GpuIdentity]:
        """The identities of the GPUs the draining actions name (for the decision trail), at most MAX_TRAIL_GPUS."""
        seen: dict[int, GpuIdentity] = {}
        for ask in self.actions:
            if ask.get("drains"):
                for gpu in ask.get("gpus", []):
                    seen.setdefault(gpu["index"], gpu)
        return list(seen.values())[:MAX_TRAIL_GPUS]


def short(text: str, limit: int) -> str:
    """One line of safe characters (no quotes, no control characters), cut to `limit`."""
    text = _UNSAFE.sub("?", " ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def gpu_uuids(identities: dict[str, GpuIdentity]) -> dict[str, str]:
    """`gpu3` -> its UUID, for a per-device consumer (a finding's subject is the NVML index)."""
    return {subject: gpu["uuid"] for subject, gpu in list(identities.items())[:MAX_GPUS] if "uuid" in gpu}


def reading(mode: str, path: str | os.PathLike[str] | None) -> str:
    """What was judged: `live`, or the recording (`simulated:/.../hgx-h100-drifted`). A daemon replaying
    a recording must never answer for the machine it runs on, nor for another recording."""
    return "live" if mode == "live" or path is None else f"{mode}:{os.path.realpath(path)}"


def summarise(report: Report, earlier: dict[str, GpuIdentity] | None = None) -> dict[str, Any]:
    """The verdict, the actions (worst first, each with its GPUs' identities) and the GPUs' UUIDs of one
    evaluation; `earlier`: the GPU identities the daemon's earlier evaluations knew (gpu_identity.learn)."""
    ids = gpu_identities(report.facts if isinstance(report.facts, NodeFacts) else None, earlier)
    snap = report.node.get("snapshot")
    return {"schema": SUMMARY_SCHEMA, **verdict_json(report.findings, ids), "profile": report.profile,
            "evaluated_at": report.started_at, "gpus": gpu_uuids(ids), "results": results_of(report.findings),
            "reading": reading(str(report.node.get("mode")), snap.get("path") if isinstance(snap, dict) else None)}


def results_of(findings: list[Finding]) -> list[list[str]]:
    """[check, subject, status, weight] of each finding (a waived one's status: `waived`), at most MAX_RESULTS."""
    out = []
    for f in findings[:MAX_RESULTS]:
        degrades = f.waiver is None and (f.status is Status.FAIL or (f.status is Status.WARN and
                                                                      f.severity is not Severity.INFO))
        out.append([f.check, f.subject, "waived" if f.waiver is not None else f.status.value,
                    DRAINS if drains(f) else DEGRADES if degrades else ""])
    return out


def _results(value: object) -> dict[tuple[str, str], tuple[str, str]]:
    if value is None:
        return {}  # a summary from before results: no cause can come back as pass
    if not isinstance(value, list):
        raise SummaryError("results is not a list")
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for item in value[:MAX_RESULTS]:
        if not isinstance(item, list) or len(item) != 4:
            raise SummaryError("a result is not [check, subject, status, weight]")
        check, subject, status, weight = (_text(v, "result") for v in item)
        key, weight = (check, subject), weight if weight in (DRAINS, DEGRADES) else ""
        earlier = out.get(key)
        if earlier is not None:  # one (check, subject) twice: a pass never hides the other, the weight adds up
            status = earlier[0] if earlier[0] != "pass" else status
            weight = next((w for w in (DRAINS, DEGRADES) if w in (earlier[1], weight)), "")
        out[key] = (status, weight)
    return out


class SummaryError(ValueError):
    """A summary read back that is not what nodewarden writes."""


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise SummaryError(f"{what} is not a string")
    return short(value, MAX_TEXT)


def _texts(value: object, what: str) -> list[str]:
    if not isinstance(value, list):
        raise SummaryError(f"{what} is not a list")
    return [_text(v, what) for v in value[:MAX_ITEMS]]


def _gpus(value: object) -> list[GpuIdentity]:
    """An action's GPU identities read back: objects with an index, known string fields only."""
    if value is None:
        return []  # a state file from before GPU identities
    if not isinstance(value, list):
        raise SummaryError("an action's gpus is not a list")
    out = []
    for item in value[:MAX_ITEMS]:
        index = item.get("index") if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 1000:
            raise SummaryError("a GPU without an index")
        out.append({"index": index, **{k: _text(item[k], k) for k in GPU_FIELDS if k in item}})
    return out


def parse_summary(doc: object, how: str, *, age_s: float | None = None) -> Answer:
    """An Answer from a summary read back (state file, one-shot child); SummaryError when malformed."""
    if not isinstance(doc, dict) or doc.get("schema") != SUMMARY_SCHEMA:
        raise SummaryError(f"not a {SUMMARY_SCHEMA} document")
    verdict = doc.get("verdict")
    if verdict not in VERDICTS:
        raise SummaryError("no known verdict")
    raw = doc.get("actions")
    if not isinstance(raw, list):
        raise SummaryError("actions is not a list")
    actions = []
    for item in raw[:MAX_ACTIONS]:
        if not isinstance(item, dict):
            raise SummaryError("an action is not an object")
        actions.append({"action": _text(item.get("action"), "action"), "drains": item.get("drains") is True,
                        "severity": _text(item.get("severity"), "severity"),
                        "checks": _texts(item.get("checks"), "checks"),
                        "subjects": _texts(item.get("subjects"), "subjects"),
                        "gpus": _gpus(item.get("gpus")),
                        "message": _text(item.get("message") or "", "message")})
    gpus_raw = doc.get("gpus") or {}
    if not isinstance(gpus_raw, dict):
        raise SummaryError("gpus is not an object")
    gpus = {_text(k, "gpu"): _text(v, "uuid") for k, v in list(gpus_raw.items())[:MAX_GPUS]}
    return Answer(str(verdict), how, actions=actions, gpus=gpus, age_s=age_s, results=_results(doc.get("results")))
