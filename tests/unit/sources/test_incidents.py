"""The facts' kernel-log records as ledger incidents (agent.sources.incidents): identity and keys."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.facts_nvml import GpuFacts, NvmlFacts
from agent.sources.host import absent_host_facts
from agent.sources.incidents import incidents_from_facts
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.kmsg import parse_kmsg_text
from agent.sources.nvml_events import EVENT_XID_NOTE

REPO = Path(__file__).resolve().parents[3]
LOG = REPO / "fixtures" / "kmsg" / "dmesg.0.log"  # real: Xid 48, 63, 94 on 0000:19:00
OBSERVED = dt.datetime(2024, 11, 15, 13, 0, tzinfo=dt.timezone.utc)
GPU0 = GpuFacts(index=0, uuid="GPU-d6ad6568", serial="1650124656070", pci_bus_id="0000:19:00.0")


def _facts(records: tuple[KmsgRecord, ...], uptime_s: float = 3 * 86400) -> NodeFacts:
    host = dataclasses.replace(absent_host_facts("test"), uptime_s=uptime_s)
    nvml = NvmlFacts(driver_version="550.54.15", cuda_driver_version="12.4", nvml_version="12.550.54.15",
                     device_count=1, gpus=(GPU0,))
    return parse_kernel_log(NodeFacts(host=host, kmsg=records, nvml=nvml, observed_at=OBSERVED))


def test_a_real_log_gives_one_incident_per_line_keyed_to_the_gpu_and_boot() -> None:
    records = parse_kmsg_text(LOG.read_text().splitlines())
    found = [i for i in incidents_from_facts(_facts(records), boot_id="boot-a", source="daemon", now=0.0)
             if i.kind == "xid"]
    assert len(found) == sum("NVRM: Xid" in line for line in LOG.read_text().splitlines())
    assert {i.gpu.serial for i in found} == {"1650124656070"} and {i.boot_id for i in found} == {"boot-a"}
    assert len({i.digest for i in found}) == len(found)  # distinct lines, distinct incidents
    assert {i.severity for i in found if i.code == "48"} == {"critical"}
    first = found[0]
    assert first.ts == dt.datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=dt.timezone.utc).timestamp()
    # read again (a restart re-reading the log): the same digests, so the ledger keeps one of each
    again = incidents_from_facts(_facts(records), boot_id="boot-a", source="daemon", now=999.0)
    assert [i.digest for i in again if i.kind == "xid"] == [i.digest for i in found]
    # the same line in another boot is another incident
    other = incidents_from_facts(_facts(records), boot_id="boot-b", source="daemon", now=0.0)
    assert not {i.digest for i in other} & {i.digest for i in found}


def test_a_line_from_before_this_boot_gets_no_boot_id() -> None:
    records = parse_kmsg_text(LOG.read_text().splitlines())
    found = incidents_from_facts(_facts(records, uptime_s=3600), boot_id="boot-a", source="daemon", now=0.0)
    # booted at 12:00; the Xids at 12:02 are this boot's, the peermem lines at 05:39 the boot before
    xids = [i for i in found if i.kind == "xid"]
    assert xids and {i.boot_id for i in xids} == {"boot-a"}
    early = parse_kmsg_text(["2024-11-15T05:39:15,491363+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1, GPU has "
                             "fallen off the bus."])
    [old] = [i for i in incidents_from_facts(_facts(early, uptime_s=3600), boot_id="boot-a", source="daemon",
                                             now=0.0) if i.kind == "xid"]
    assert old.boot_id == ""  # an earlier boot's, which one the log does not say: never counted as this boot


def test_an_xid_the_event_set_saw_first_is_recorded_from_the_log_line_only() -> None:
    event = KmsgRecord(f"NVRM: Xid (PCI:0000:19:00.0): 79, {EVENT_XID_NOTE}", 3, None, 5_000_000)
    line = KmsgRecord("NVRM: Xid (PCI:0000:19:00): 79, pid=1, GPU has fallen off the bus.", 3, 12, 5_100_000)
    assert [i for i in incidents_from_facts(_facts((event,)), boot_id="b", source="daemon", now=0.0)
            if i.kind == "xid"] == []
    [xid] = [i for i in incidents_from_facts(_facts((event, line)), boot_id="b", source="daemon", now=0.0)
             if i.kind == "xid"]
    assert xid.code == "79" and "fallen off the bus" in xid.detail


def test_no_log_no_incidents() -> None:
    from agent.core.model import Unknown

    facts = _facts(())
    facts = parse_kernel_log(dataclasses.replace(facts, kmsg=Unknown("not read")))
    assert incidents_from_facts(facts, boot_id="b", source="daemon", now=0.0) == []
