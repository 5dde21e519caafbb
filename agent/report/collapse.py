"""Rows for people: identical results across GPUs or ports said once, in the order that matters.

`gpu.retired_pages skip` on gpu0..gpu6 with the same message but for the GPU's own name is one
row, `gpu0-6`; results that differ in anything but the part's name (status, severity, observed,
expected, action, waiver, reason, or a word of the message) stay apart. Subjects are never cut:
a group whose names do not compress lists every one of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.core.model import Finding, Severity, Status
from agent.core.names import compress, natural_key

STATUS_ORDER = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2, Status.FIXED: 3, Status.SKIP: 4, Status.PASS: 5}
SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
ELIDED = "\u2026"  # where the collapsed parts' messages differ: their own names and addresses
# What a per-GPU message starts with: "GPU 3 (0000:5d:00.0) ", "gpu3: ".
_GPU_PREFIX = re.compile(r"^(?:GPU \d+(?: \([0-9A-Fa-f:.]+\))?|gpu\d+):? +")


def rank(finding: Finding) -> tuple[int, int, int]:
    """Worst first: unwaived before waived, then status (fail, unknown, warn, ...), then severity."""
    return (1 if finding.waiver else 0, STATUS_ORDER[finding.status], SEVERITY_ORDER[finding.severity])


@dataclass
class Row:
    findings: list[Finding]  # one finding, or several identical results
    subject: str  # what people read: the label, or the subjects said once (gpu0-6)
    message: str

    @property
    def first(self) -> Finding:
        return self.findings[0]


def display_subjects(findings: Iterable[Finding]) -> dict[int, str]:
    """id(finding) -> its subject for people: the label where one is given and it names one subject only."""
    findings = list(findings)
    owners: dict[tuple[str, str], set[str]] = {}
    for f in findings:
        if f.label:
            owners.setdefault((f.check, f.label), set()).add(f.subject)
    return {id(f): f.label if f.label and len(owners[(f.check, f.label)]) == 1 else f.subject for f in findings}


def _same_result(finding: Finding) -> tuple[object, ...]:
    def frozen(value: object) -> str:
        return json.dumps(value, sort_keys=True, default=str)

    return (finding.check, finding.status, finding.severity, finding.action, finding.remediation, finding.reason,
            finding.waiver, frozen(finding.observed), frozen(finding.expected))


def _own_words(finding: Finding) -> list[str]:
    """The message without the part's own name in front (what the subject column says already)."""
    message = finding.message
    if re.fullmatch(r"gpu\d+", finding.subject):
        message = _GPU_PREFIX.sub("", message, count=1)
    elif message.startswith(finding.subject + " ") or message.startswith(finding.subject + ": "):
        message = message[len(finding.subject):].lstrip(": ")
    return message.split(" ")


def _elide(column: tuple[str, ...]) -> str:
    """One word for words that differ: what they share up to a punctuation mark stays (`(0000:…:00.0)`)."""
    shortest = min(len(w) for w in column)
    head = 0
    while head < shortest and len({w[head] for w in column}) == 1:
        head += 1
    while head and column[0][head - 1].isalnum():
        head -= 1
    tail = 0
    while tail < shortest - head and len({w[-1 - tail] for w in column}) == 1:
        tail += 1
    while tail and column[0][-tail].isalnum():
        tail -= 1
    return column[0][:head] + ELIDED + (column[0][-tail:] if tail else "")


def _template(messages: list[list[str]]) -> str:
    words: list[str] = []
    for column in zip(*messages, strict=True):
        word = column[0] if len(set(column)) == 1 else _elide(column)
        if not (word == ELIDED and words and words[-1] == ELIDED):
            words.append(word)
    return " ".join(words)


def collapse(findings: list[Finding], subjects: dict[int, str]) -> list[Row]:
    """Rows, worst first; identical results on several parts are one row."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for finding in findings:
        groups.setdefault(_same_result(finding), []).append(finding)
    rows: list[Row] = []
    for group in groups.values():
        # Same result; the messages may still say different things: only words with digits
        # (names, addresses) may differ inside one row.
        shapes: dict[tuple[object, ...], list[tuple[Finding, list[str]]]] = {}
        for finding in group:
            words = _own_words(finding)
            shape = (len(words), *("#" if any(c.isdigit() for c in w) else w for w in words))
            shapes.setdefault(shape, []).append((finding, words))
        for members in shapes.values():
            names = [subjects[id(f)] for f, _ in members]
            if len(members) < 2 or len(set(names)) < len(names):
                rows.extend(Row([f], subjects[id(f)], f.message) for f, _ in members)
                continue
            subject = compress(names) or ", ".join(sorted(names, key=natural_key))
            rows.append(Row([f for f, _ in members], subject, _template([w for _, w in members])))
    rows.sort(key=lambda r: (rank(r.first), r.first.check, natural_key(r.subject)))
    return rows
