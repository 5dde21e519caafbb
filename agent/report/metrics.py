"""The daemon's /metrics: families built from cached facts (the server: agent.io.metrics_server).

Nothing here reads hardware. The daemon builds the exposition once per
evaluation (`NodeMetrics.render`) and the server hands those bytes out, with
prometheus-client's process metrics appended per scrape, so a scrape costs
the same whether the BMC answers or hangs. Names: docs/metrics.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.core.facts import BmcFacts, NvmlFacts
from agent.core.history import History
from agent.core.model import Unknown

# The server lives in agent.io.metrics_server (issue 21); re-exported for the daemon and older imports.
from agent.io.metrics_server import Exposition, MetricsServer, ServerSettings
from agent.report.model import Report
from agent.report.prom import render_families, report_families

__all__ = ["Exposition", "MetricsServer", "ServerSettings"]  # re-exported; the names defined here are public too
log = logging.getLogger(__name__)
# PSU and fan health codes, ordered by badness (max() is the worst); docs/metrics.md.
HEALTH_CODES = {"ok": 0, "absent": 1, "unknown": 2, "warning": 3, "critical": 4}
# GPU labels as dcgm-exporter names them, so the two join on (instance, gpu) or UUID.
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "modelName"]


def _known(value: Any) -> bool:
    return value is not None and not isinstance(value, Unknown)


def _health(state: str | None, health: str | None) -> str:
    if state == "Absent":
        return "absent"
    return {"ok": "ok", "warning": "warning", "critical": "critical"}.get(str(health or "").lower(), "unknown")


def _dcgm_bus_id(address: Any) -> str:
    """NVML's bus id as dcgm-exporter prints it (00000000:19:00.0) from ours (0000:19:00.0)."""
    if not isinstance(address, str) or address.count(":") != 2:
        return ""
    domain, rest = address.split(":", 1)
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return ""


@dataclass
class NodeMetrics:
    """Everything /metrics shows, as of one evaluation."""

    report: Report | None
    last_success: dict[str, float] | None = field(default_factory=dict)  # source -> Unix time (0: never)
    xid_counts: dict[tuple[str, int], int] = field(default_factory=dict)  # (PCI address, xid) -> events
    timing: bool = True  # False: the daemon serves the timestamps per scrape (`freshness_families`)
    seen: GpuLabels | None = None  # the daemon's memory of each GPU's labels, for the ones it loses

    def families(self) -> list[Metric]:
        families: list[Metric] = report_families(self.report, self.timing) if self.report is not None else []
        if self.last_success is not None:
            families.append(last_success_family(self.last_success))
        facts = self.report.facts if self.report is not None else None
        nvml = facts.nvml if facts is not None else None
        bmc = facts.bmc if facts is not None else None
        families += gpu_families(nvml if isinstance(nvml, NvmlFacts) else None, self.seen)
        families += bmc_families(bmc if isinstance(bmc, BmcFacts) else None)
        families += rdma_families(facts.host.rdma if facts is not None else None)
        families.append(firmware_family(nvml if isinstance(nvml, NvmlFacts) else None,
                                        bmc if isinstance(bmc, BmcFacts) else None))
        host = facts.host if facts is not None else None
        pci_gpus = host.nvidia_gpus if host is not None and isinstance(host.nvidia_gpus, tuple) else ()
        families.append(xid_family(self.xid_counts, nvml if isinstance(nvml, NvmlFacts) else None,
                                   tuple(sorted(g.address for g in pci_gpus))))
        if self.report is not None:
            families += history_families(self.report)
        return families

    def render(self) -> bytes:
        return render_families(self.families())


def last_success_family(last_success: dict[str, float]) -> Metric:
    last = GaugeMetricFamily("nodewarden_source_last_success_timestamp_seconds",
                             "Unix time of the source's last successful read (0: never)", labels=["source"])
    for source, stamp in sorted(last_success.items()):
        last.add_metric([source], stamp)
    return last


def freshness_families(last_success: dict[str, float], confirmed_at: float) -> list[Metric]:
    """What changes with every poll even when the facts do not: served per scrape by the daemon."""
    audited = GaugeMetricFamily("nodewarden_audit_timestamp_seconds",
                                "When the checks last ran, or a poll confirmed their facts unchanged since they "
                                "ran (Unix time); it stops while evaluations fail")
    audited.add_metric([], confirmed_at)
    return [last_success_family(last_success), audited]


def reload_families(ok: bool, last_success_s: float, failed_file: str | None) -> list[Metric]:
    """How the daemon's last configuration reload went (as Prometheus' own `_config_last_reload_*`).

    A reload that fails keeps the last good configuration judging; these say so, and which file to fix.
    """
    success = GaugeMetricFamily("nodewarden_config_reload_success",
                                "1 if the last configuration reload worked, 0 if it failed (the last good "
                                "configuration is still judging)")
    success.add_metric([], 1 if ok else 0)
    stamp = GaugeMetricFamily("nodewarden_config_last_reload_success_timestamp_seconds",
                              "Unix time of the last configuration load that worked (the start's included)")
    stamp.add_metric([], last_success_s)
    failure = GaugeMetricFamily("nodewarden_config_reload_failure_info",
                                "1 for the file the failing reload could not use (only while it fails)",
                                labels=["file"])
    if not ok:
        failure.add_metric([failed_file or ""], 1)
    return [success, stamp, failure]


class GpuLabels:
    """The UUID, bus id and model each GPU index had when it last answered.

    A lost GPU (NVML GpuIsLost, fallen off the bus) answers nothing, so its series would carry
    empty labels just when an operator needs to know which board to pull. The daemon keeps one of
    these for its lifetime; a GPU first seen lost (after a restart) has nothing to remember.
    """

    def __init__(self) -> None:
        self._by_index: dict[int, list[str]] = {}

    def labels(self, index: int, current: list[str]) -> list[str]:
        """`current` (gpu, UUID, pci_bus_id, modelName) with the empty ones filled from the last sighting."""
        known = self._by_index.get(index)
        if all(current[1:]):
            self._by_index[index] = current
            return current
        if known is None:
            return current
        filled = [value or old for value, old in zip(current, known, strict=True)]
        if current[1] and known[1] != current[1]:  # another board in that slot: nothing to borrow
            return current
        return filled


def gpu_families(nvml: NvmlFacts | None, seen: GpuLabels | None = None) -> list[Metric]:
    labels = GPU_LABELS
    up = GaugeMetricFamily("nodewarden_gpu_up", "1 if the GPU answered its last NVML read", labels=labels)
    temp = GaugeMetricFamily("nodewarden_gpu_temperature_celsius", "GPU core temperature", labels=labels)
    margin = GaugeMetricFamily("nodewarden_gpu_thermal_margin_celsius",
                               "Slowdown threshold minus temperature (low: about to throttle)", labels=labels)
    power = GaugeMetricFamily("nodewarden_gpu_power_watts", "GPU power draw", labels=labels)
    limit = GaugeMetricFamily("nodewarden_gpu_power_limit_watts", "GPU power limits (enforced, default)",
                              labels=[*labels, "limit"])
    # Counts that only grow (volatile ones reset with the driver, which rate() handles as a counter reset).
    ecc = CounterMetricFamily("nodewarden_gpu_ecc_errors", "ECC error counts as NVML reports them",
                              labels=[*labels, "type", "scope"])
    remap = GaugeMetricFamily("nodewarden_gpu_remapped_rows", "HBM row remaps", labels=[*labels, "type"])
    nvlink = GaugeMetricFamily("nodewarden_gpu_nvlink_active_links", "NVLink links in the active state",
                               labels=labels)
    width = GaugeMetricFamily("nodewarden_gpu_pcie_link_width", "PCIe link width", labels=[*labels, "which"])
    families: list[Metric] = [up, temp, margin, power, limit, ecc, remap, nvlink, width]
    if nvml is None:
        return families
    for gpu in nvml.gpus:
        key = [str(gpu.index), gpu.uuid if isinstance(gpu.uuid, str) else "", _dcgm_bus_id(gpu.pci_bus_id),
               gpu.name if isinstance(gpu.name, str) else ""]
        if seen is not None:
            key = seen.labels(gpu.index, key)
        readable = gpu.lost is None and not isinstance(gpu.name, Unknown)
        up.add_metric(key, 1 if readable else 0)
        if not readable:
            continue
        _add(temp, key, gpu.temperature_c)
        if _known(gpu.temperature_c) and _known(gpu.slowdown_c):
            margin.add_metric(key, float(gpu.slowdown_c) - float(gpu.temperature_c))  # type: ignore[arg-type]
        _add(power, key, gpu.power_w)
        # The board's min/max limits are constants no alert or panel reads: left out (cardinality).
        for name, value in (("enforced", gpu.enforced_limit_w), ("default", gpu.default_limit_w)):
            _add(limit, [*key, name], value)
        for kind, scope, value in (("corrected", "volatile", gpu.ecc_volatile_corrected),
                                   ("uncorrected", "volatile", gpu.ecc_volatile_uncorrected),
                                   ("corrected", "aggregate", gpu.ecc_aggregate_corrected),
                                   ("uncorrected", "aggregate", gpu.ecc_aggregate_uncorrected)):
            _add(ecc, [*key, kind, scope], value)
        for kind, value in (("correctable", gpu.remapped_correctable), ("uncorrectable", gpu.remapped_uncorrectable),
                            ("pending", gpu.remap_pending), ("failure", gpu.remap_failure)):
            _add(remap, [*key, kind], value)
        states = gpu.nvlink_states
        if isinstance(states, tuple):
            nvlink.add_metric(key, len([state for state in states if state == 1]))
        _add(width, [*key, "current"], gpu.pcie_width)
        _add(width, [*key, "max"], gpu.pcie_width_max)
    return families


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: Any) -> None:
    if _known(value) and isinstance(value, (int, float)):
        family.add_metric(labels, float(value))


def bmc_families(bmc: BmcFacts | None) -> list[Metric]:
    temps = GaugeMetricFamily("nodewarden_bmc_temperature_celsius", "BMC temperature sensors", labels=["sensor"])
    psu = GaugeMetricFamily("nodewarden_psu_health", "PSU health: 0 ok, 1 absent, 2 unknown, 3 warning, 4 critical",
                            labels=["psu"])
    fan = GaugeMetricFamily("nodewarden_fan_health", "Fan health: 0 ok, 1 absent, 2 unknown, 3 warning, 4 critical",
                            labels=["fan"])
    redundancy = GaugeMetricFamily("nodewarden_psu_redundancy_ok", "1 if the PSU redundancy group is healthy",
                                   labels=["group"])
    families: list[Metric] = [temps, psu, fan, redundancy]
    if bmc is None:
        return families
    if isinstance(bmc.temperatures, tuple):
        for sensor in bmc.temperatures:
            if sensor.reading is not None and sensor.state != "Absent":
                temps.add_metric([sensor.name], sensor.reading)
    for family, items in ((psu, bmc.psus), (fan, bmc.fans)):
        if isinstance(items, tuple):
            seen: set[str] = set()
            for item in items:
                if item.name not in seen:  # a series must be unique; the first item of a name wins
                    seen.add(item.name)
                    family.add_metric([item.name], HEALTH_CODES[_health(item.state, item.health)])
    if isinstance(bmc.redundancy, tuple):
        for group in bmc.redundancy:
            ok = str(group.health or "").lower() == "ok" and group.state not in ("Disabled", "UnavailableOffline")
            redundancy.add_metric([group.name], 1 if ok else 0)
    return families


IB_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                     "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


def rdma_families(rdma: Any) -> list[Metric]:
    """RDMA ports: state, rate and the error counters as counters, so Prometheus turns them into rates."""
    up = GaugeMetricFamily("nodewarden_ib_port_up", "1 if the RDMA port is ACTIVE and LinkUp",
                           labels=["device", "port"])
    rate = GaugeMetricFamily("nodewarden_ib_port_rate_gbps", "The RDMA port's link rate", labels=["device", "port"])
    errors = CounterMetricFamily("nodewarden_ib_port_errors", "RDMA port error counters since boot",
                                 labels=["device", "port", "counter"])
    families: list[Metric] = [up, rate, errors]
    if not isinstance(rdma, tuple):
        return families
    for device in rdma:
        if not isinstance(device.ports, tuple):
            continue
        for port in device.ports:
            key = [device.name, str(port.port)]
            up.add_metric(key, 1 if (port.state, port.phys_state) == ("ACTIVE", "LinkUp") else 0)
            if isinstance(port.rate, str) and port.rate.split(" ", 1)[0].replace(".", "", 1).isdigit():
                rate.add_metric(key, float(port.rate.split(" ", 1)[0]))
            if isinstance(port.counters, dict):
                for name in IB_ERROR_COUNTERS:
                    value = port.counters.get(name)
                    if isinstance(value, int):
                        errors.add_metric([*key, name], value)
    return families


def firmware_family(nvml: NvmlFacts | None, bmc: BmcFacts | None) -> Metric:
    info = GaugeMetricFamily("nodewarden_firmware_info", "Firmware and driver versions",
                             labels=["component", "version"])
    seen: set[tuple[str, str]] = set()

    def add(component: str, version: Any) -> None:
        if isinstance(version, str) and version and (component, version) not in seen:
            seen.add((component, version))
            info.add_metric([component, version], 1)

    if bmc is not None:
        add("bmc", bmc.manager_firmware)
        add("bios", bmc.bios_version)
        if isinstance(bmc.firmware, tuple):
            for item in bmc.firmware:
                if item.installed:
                    add(item.stable_id, item.version)
    if nvml is not None:
        add("driver", nvml.driver_version)
        for gpu in nvml.gpus:
            add(f"gpu{gpu.index}.vbios", gpu.vbios)
    return info


def history_families(report: Report) -> list[Metric]:
    """The ledger's counts and the history rules that fire now (issue 33.5); none without a ledger.

    nodewarden_incidents_total counts incidents recorded since the ledger began (retention removes rows,
    never counts), so `increase()` over it is what happened; nodewarden_repeat_offender is, per rule,
    how many GPUs (or 1 for the node) meet it now, 0 for a rule that does not fire.
    """
    history = getattr(report.facts, "history", None) if report.facts is not None else None
    if not isinstance(history, History):
        return []
    total = CounterMetricFamily("nodewarden_incidents", "Incidents the ledger recorded, by kind", labels=["kind"])
    last = GaugeMetricFamily("nodewarden_last_incident_timestamp_seconds",
                             "When the newest incident of the kind happened (Unix time)", labels=["kind"])
    for kind, count, newest in history.totals:
        total.add_metric([kind], count)
        last.add_metric([kind], newest)
    fired: dict[str, set[str]] = {rule: set() for rule in history.rules}
    for finding in report.findings:
        if finding.check.startswith("history.") and isinstance(finding.observed, list):
            for item in finding.observed:
                if isinstance(item, dict) and isinstance(item.get("rule"), str):
                    fired.setdefault(item["rule"], set()).add(finding.subject)
    offender = GaugeMetricFamily("nodewarden_repeat_offender",
                                 "GPUs (or 1 for the node) a history rule fires for now, 0 when none",
                                 labels=["rule"])
    for rule, subjects in sorted(fired.items()):
        offender.add_metric([rule], len(subjects))
    return [total, last, offender]


def xid_family(counts: dict[tuple[str, int], int], nvml: NvmlFacts | None, pci_gpus: tuple[str, ...] = ()) -> Metric:
    """Xid events since the daemon started (the boot's earlier ones counted at start); gpu = NVML index.

    A GPU NVML cannot read (fallen off the bus: the Xid that matters most) has no bus id from
    NVML; NVML numbers GPUs in PCI bus order, so its place among the host's NVIDIA GPUs gives it.
    """
    index_of: dict[str, str] = {address: str(number) for number, address in enumerate(pci_gpus)}
    if nvml is not None:
        for gpu in nvml.gpus:
            if isinstance(gpu.pci_bus_id, str):
                index_of[gpu.pci_bus_id] = str(gpu.index)
    family = CounterMetricFamily("nodewarden_xid_errors", "Xid events in the kernel log", labels=["gpu", "xid"])
    for (address, xid), count in sorted(counts.items()):
        family.add_metric([index_of.get(address, address), str(xid)], count)
    return family
