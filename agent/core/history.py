"""What happened on a node before this evaluation: the ledger's incidents as plain values (issue 33).

An `Incident` is one thing that happened once (an Xid line, a drain, a remediation, a fault that
appeared), keyed to the hardware that had it: a GPU by index, UUID *and* serial, so its history
follows the board across a reboot (the index can change) and stays with the old serial after a swap.
`History` is the window a check is given; `Unknown` when there is no ledger to read (never a finding
in itself). Standard library only: the ledger (agent.state.ledger) stores these, checks judge them.
"""

from __future__ import annotations

from typing import NamedTuple

from agent.core.counters import Sample

# What an incident is. Rules name kinds, so these are part of the profile format.
KINDS = ("xid", "sxid", "ecc", "remap", "pcie", "nvlink", "bmc_event", "psu", "kernel_event", "fault",
         "remediation", "drain", "resume", "decision", "accept", "rule", "clear")
MAX_TEXT = 500  # a subject or detail longer than this is cut: a ledger row is evidence, not a log
MAX_DETAIL = 2048  # a detail may hold one health-check decision's JSON line (scheduler.trail.MAX_LINE)


class GpuRef(NamedTuple):
    """A GPU as the ledger keys it: any of the three may be unknown ("" / None)."""

    index: int | None = None  # type: ignore[assignment]  # shadows tuple.index on purpose, as GpuFacts
    uuid: str = ""
    serial: str = ""

    def matches(self, wanted: str) -> bool:
        """`wanted` is a serial, a UUID (with or without its GPU- prefix) or an index."""
        if not wanted:
            return False
        if wanted in (self.serial, self.uuid) or (self.uuid and self.uuid.lower() == f"gpu-{wanted.lower()}"):
            return True
        return wanted.isdigit() and self.index == int(wanted)

    @property
    def key(self) -> str:
        """What a per-GPU rule counts by: the serial (history follows the board), else the UUID, else
        the slot. An index alone is a slot, not a board: good enough within one boot only."""
        return self.serial or self.uuid or (f"index:{self.index}" if self.index is not None else "")


class Incident(NamedTuple):
    ts: float  # when it happened (the record's own time when it has one), Unix seconds
    kind: str  # one of KINDS
    source: str  # who saw it: kmsg, nvml, bmc, audit, daemon, health-check, accept, remediate, ledger
    code: str = ""  # Xid 79 -> "79", a check id for faults, a rule name for rule/clear
    subcode: str = ""
    gpu: GpuRef = GpuRef()
    subject: str = ""  # what it is about when not a GPU: a PSU, a link, a node
    severity: str = ""
    boot_id: str = ""  # the boot it happened in ("" when the evidence does not say)
    detail: str = ""
    digest: str = ""  # identity for de-duplication (see `digest`)

    def scope_key(self, scope: str) -> str:
        """The key a rule counts under: the GPU's for scope gpu, the node's ("") for scope node."""
        return self.gpu.key if scope == "gpu" else ""


def digest(*parts: object) -> str:
    """A stable identity: the same kernel line read twice (the follower, then a restart re-reading
    the log) gives the same digest, so it is one incident."""
    import hashlib  # here: a one-shot audit without a ledger never computes one (its start-up stays lean)

    return hashlib.sha256("\x1f".join("" if p is None else str(p) for p in parts).encode("utf-8", "replace")
                          ).hexdigest()[:32]


def cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class History(NamedTuple):
    """The incidents a ledger holds from `since` to `until` (Unix seconds), oldest first."""

    incidents: tuple[Incident, ...]
    since: float
    until: float
    boot_id: str = ""  # the boot being judged now
    note: str = ""  # what the ledger said on opening (rebuilt, refused), for the report
    # (kind, incidents recorded since the ledger began, the newest one's time): the metrics' counters
    totals: tuple[tuple[str, int, float], ...] = ()
    rules: tuple[str, ...] = ()  # the profile's history rules judged over it (each is a metric, fired or not)
    samples: tuple[Sample, ...] = ()  # GPU counter samples for the rates (agent.core.counters)
