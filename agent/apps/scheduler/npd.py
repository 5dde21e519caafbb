"""node-problem-detector's custom plugin protocol: one line on stdout (NPD keeps at most 80 bytes of
it as the condition's message) and the exit code: 0 OK, 1 NonOK, 2 Unknown."""

from __future__ import annotations

from agent.apps.scheduler.answer import Answer, short
from agent.apps.scheduler.settings import HealthSettings

NPD_OK, NPD_NONOK, NPD_UNKNOWN = 0, 1, 2
MAX_LINE = 80


def npd_line(answer: Answer, settings: HealthSettings) -> tuple[str, int]:
    if answer.verdict is None:
        return short(f"UNKNOWN: {answer.why}", MAX_LINE), NPD_UNKNOWN
    if not answer.actions:
        return f"{answer.verdict}: nothing to do", NPD_OK if not settings.bad(answer.verdict) else NPD_NONOK
    code = NPD_NONOK if settings.bad(answer.verdict) else NPD_OK
    head = f"{answer.verdict}: "
    return head + answer.worst(MAX_LINE - len(head)), code
