"""The BMC as one source: Redfish first, IPMI where Redfish is missing or has no usable sensors.

It reports two statuses (`redfish`, `ipmi`) and is recorded as the snapshot's `redfish/` tree and
`ipmi.json`. A BMC named on the command line (`--bmc`, `--ipmi`) is read live even for a recorded
host; the snapshot's BMC is used only when none is named. Each protocol's library is imported only
when that protocol is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.core.errors import SnapshotError
from agent.core.facts import BmcFacts
from agent.core.model import SourceStatus, Unknown, Unsupported
from agent.io.credentials import BmcOptions
from agent.policy.polls import BMC_INVENTORY, BMC_SENSORS
from agent.sources.local_sources import json_recording
from agent.sources.source import (
    NOT_IN_SNAPSHOT,
    PENDING,
    CaptureOptions,
    NodeView,
    PollResult,
    ReadOptions,
    Recording,
    Source,
    pending_status,
)

if TYPE_CHECKING:
    from agent.sources.snapshot_dir import Snapshot

IPMI_FILE = "ipmi.json"
RECORDING_MAX_BYTES = 32 << 20  # ipmi.json: a full SEL is a few MB
# What the frequent sensor poll refreshes over the inventory walk's facts.
SENSOR_PARTS = ("temperatures", "fans", "psus", "redundancy", "power_consumed_w", "leak_detectors")
PROTOCOLS = ("redfish", "ipmi")


def merge_bmc(redfish_facts: BmcFacts | Unknown | None, ipmi_facts: BmcFacts | Unknown | None
              ) -> BmcFacts | Unknown:
    """Redfish's view, with IPMI's sensors where Redfish has none that report."""
    if not isinstance(redfish_facts, BmcFacts):
        if isinstance(ipmi_facts, BmcFacts):
            return ipmi_facts
        return redfish_facts or ipmi_facts or Unsupported("no BMC configured")
    if not isinstance(ipmi_facts, BmcFacts):
        return redfish_facts
    merged = redfish_facts
    for part in ("temperatures", "fans", "psus"):
        ours = getattr(redfish_facts, part)
        # Old Redfish services list every sensor as Absent (often with 0 readings).
        usable = not isinstance(ours, Unknown) and any(getattr(item, "state", None) != "Absent" for item in ours)
        if not usable and not isinstance(getattr(ipmi_facts, part), Unknown):
            merged = merged._replace(**{part: getattr(ipmi_facts, part)})
    if isinstance(merged.events, Unknown) and not isinstance(ipmi_facts.events, Unknown):
        merged = merged._replace(events=ipmi_facts.events)
    return merged


def load_recording(path: Path) -> Any:
    from agent.io.jsonfile import JsonInputError, load_json_file

    try:
        return load_json_file(path, max_bytes=RECORDING_MAX_BYTES)
    except JsonInputError:
        raise
    except OSError as exc:
        raise SnapshotError(f"unreadable: {exc}", path=str(path)) from None


def _errors(statuses: Mapping[str, SourceStatus]) -> str:
    return "; ".join(f"{n}: {s.error}" for n, s in sorted(statuses.items()) if not s.ok)


class BmcSource(Source):
    name = "bmc"
    statuses = PROTOCOLS
    facts_field = "bmc"
    recorded_as = PROTOCOLS
    files = ("redfish", IPMI_FILE)
    polls = (BMC_INVENTORY, BMC_SENSORS)  # the sensors often, the whole tree rarely

    def protocols(self, node: NodeView, bmc: BmcOptions) -> tuple[str, ...]:
        """The protocols this node's BMC is read with: named on the command line, else the snapshot's."""
        snap = node.snapshot
        if bmc.configured or snap is None:
            return tuple(n for n, on in (("redfish", bool(bmc.url)), ("ipmi", bool(bmc.ipmi_host))) if on)
        return tuple(n for n in PROTOCOLS if snap.has(n))

    def reads_live(self, node: NodeView, options: ReadOptions) -> bool:
        return node.snapshot is None or options.bmc.configured

    def read(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        if self.reads_live(node, options):
            facts, statuses = self.read_live(node, options)
            missing = {name: f"not configured ({flag})" for name, flag in (("redfish", "--bmc URL"),
                                                                             ("ipmi", "--ipmi HOST"))}
        else:
            assert node.snapshot is not None
            facts, statuses = self.read_recorded(node, node.snapshot, options)
            missing = dict.fromkeys(PROTOCOLS, NOT_IN_SNAPSHOT)
        for name in PROTOCOLS:
            if name not in statuses:
                statuses[name] = SourceStatus(name, ok=False, configured=False, error=missing[name])
        return facts, statuses

    def read_live(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        bmc = options.bmc
        statuses: dict[str, SourceStatus] = {}
        redfish_facts: BmcFacts | Unknown | None = None
        ipmi_facts: BmcFacts | Unknown | None = None
        password = bmc.password.reveal() if bmc.password else ""
        if bmc.url:
            from agent.sources import redfish

            url, user = bmc.url, bmc.user or ""
            redfish_facts, statuses["redfish"], _ = redfish.read_redfish(
                lambda: redfish.LiveRedfish(url, user, password, ca_file=bmc.ca_file, insecure=bmc.insecure,
                                            timeout_s=bmc.timeout_s, concurrency=bmc.concurrency,
                                            deadline_s=bmc.deadline_s),
                concurrency=bmc.concurrency, deadline_s=bmc.deadline_s, insecure=bmc.insecure,
                paths=redfish.SENSOR_START if options.sensors_only else (redfish.ROOT,), where=url)
        if bmc.ipmi_host:
            from agent.sources.ipmi_live import read_ipmi_live

            ipmi_facts, statuses["ipmi"], _raw = read_ipmi_live(
                bmc.ipmi_host, bmc.ipmi_port, bmc.user or "", password, timeout_s=bmc.deadline_s)
        return merge_bmc(redfish_facts, ipmi_facts), statuses

    def read_recorded(self, node: NodeView, snap: Snapshot, options: ReadOptions,
                      ) -> tuple[Any, dict[str, SourceStatus]]:
        statuses: dict[str, SourceStatus] = {}
        redfish_facts: BmcFacts | Unknown | None = None
        ipmi_facts: BmcFacts | Unknown | None = None
        bmc = options.bmc
        if snap.has("redfish"):
            from agent.sources import redfish

            redfish_facts, statuses["redfish"], _ = redfish.read_redfish(
                lambda: redfish.RecordedRedfish(snap.path), concurrency=bmc.concurrency,
                deadline_s=bmc.deadline_s, paths=redfish.SENSOR_START if options.sensors_only else (redfish.ROOT,))
        if snap.has("ipmi"):
            from agent.sources.ipmi_parse import read_ipmi_recorded

            ipmi_facts, statuses["ipmi"] = read_ipmi_recorded(load_recording(snap.path / IPMI_FILE))
        return merge_bmc(redfish_facts, ipmi_facts), statuses

    def absent(self, reason: str) -> Any:
        return Unsupported(reason)

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        from agent.io.fsutil import create_file  # capture-only: off the audit's import path

        bmc = options.bmc
        if bmc is None or not bmc.configured:
            return
        password = bmc.password.reveal() if bmc.password else ""
        if bmc.url:
            from agent.sources import redfish

            url = bmc.url
            recorders: list[redfish.RecordingRedfish] = []

            def make() -> redfish.RecordingRedfish:
                recorders.append(redfish.RecordingRedfish(redfish.LiveRedfish(
                    url, bmc.user or "", password, ca_file=bmc.ca_file, insecure=bmc.insecure,
                    timeout_s=bmc.timeout_s, concurrency=bmc.concurrency, deadline_s=bmc.deadline_s)))
                return recorders[-1]

            _facts, status, _transport = redfish.read_redfish(make, concurrency=bmc.concurrency,
                                                              deadline_s=bmc.deadline_s, insecure=bmc.insecure)
            if recorders and recorders[-1].answers:
                recorders[-1].write(out)
                done.captured.append("redfish")
            if not status.ok:
                done.notes.append(f"redfish: {status.error}")
        if bmc.ipmi_host:
            from agent.sources.ipmi_live import read_ipmi_live

            _facts, status, raw = read_ipmi_live(bmc.ipmi_host, bmc.ipmi_port, bmc.user or "", password,
                                                 timeout_s=bmc.deadline_s)
            if raw:
                create_file(out, IPMI_FILE, json_recording(raw))
                done.captured.append("ipmi")
            if not status.ok:
                done.notes.append(f"ipmi: {status.error}")

    # --- the daemon's view -----------------------------------------------------------------

    def polled(self, node: NodeView, bmc: BmcOptions) -> bool:
        return bool(self.protocols(node, bmc))

    def reports(self, node: NodeView, bmc: BmcOptions) -> tuple[str, ...]:
        return self.protocols(node, bmc)

    def from_polls(self, node: NodeView, bmc: BmcOptions, results: Mapping[str, PollResult | None],
                   ) -> tuple[Any, dict[str, SourceStatus]]:
        """The inventory walk's facts with the newer sensor readings; statuses from the newest poll."""
        protocols = self.protocols(node, bmc)
        statuses = {name: pending_status(name) if name in protocols else
                    SourceStatus(name, ok=False, configured=False, error="not configured")
                    for name in PROTOCOLS}
        inventory, sensors = results.get("bmc_inventory"), results.get("bmc_sensors")
        polled = [r for r in (inventory, sensors) if r is not None]
        if not polled:
            return (Unknown(PENDING) if protocols else Unsupported("no BMC configured")), statuses
        newest = max(polled, key=lambda r: r.finished_at)
        statuses.update(newest.statuses)
        base = inventory.value if inventory is not None and isinstance(inventory.value, BmcFacts) else None
        if base is not None and newest is sensors:
            fresh = sensors.value
            if isinstance(fresh, BmcFacts):
                return base._replace(**{part: getattr(fresh, part) for part in SENSOR_PARTS}), statuses
            # The sensor poll failed after the inventory: its readings are gone, and say why.
            gone = Unknown(f"the BMC did not answer the sensor poll ({_errors(newest.statuses) or 'no data'})")
            replaced: dict[str, Any] = {part: gone for part in SENSOR_PARTS}
            return base._replace(**replaced), statuses
        if base is not None:
            return base, statuses
        if isinstance(newest.value, (BmcFacts, Unknown)):
            return newest.value, statuses
        return Unknown(_errors(newest.statuses) or "not read"), statuses
