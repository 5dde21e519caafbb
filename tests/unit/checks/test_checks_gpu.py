"""GPU checks as pure functions: hand-made NVML facts + the shipped profiles."""

from __future__ import annotations

import pytest

from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.model import Finding, Severity, SourceStatus, Status, Unknown, Unsupported
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.xid import parse_xids
from checks.gpu_ecc import CORRECTED, ECC_MODE, RETIRED, ROW_REMAP, UNCORRECTED
from checks.gpu_firmware import CUDA, DRIVER, INFOROM, VBIOS
from checks.gpu_inventory import COUNT, LOST
from checks.gpu_modes import COMPUTE, MIG, PERSISTENCE
from checks.gpu_nvlink import ERRORS, FABRIC, LINKS
from checks.gpu_pcie import LINK, REPLAY
from checks.gpu_power import CLOCK_EVENTS, POWER_LIMIT
from checks.gpu_recovery import RECOVERY
from checks.gpu_thermal import IMBALANCE, MEMORY_TEMPERATURE, TEMPERATURE
from checks.gpu_xid import XID, lookup
from tests.factories import gpu as pci_gpu
from tests.factories import gpu_facts, host, node, nvml_node, profile


@pytest.fixture(scope="module")
def h100() -> Profile:
    return ProfileStore().profile("hgx-h100-sxm")


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def statuses(findings: list[Finding]) -> dict[str, Status]:
    return {f.subject: f.status for f in findings}


def one(facts: NodeFacts, prof: Profile, check: object, subject: str) -> Finding:
    return by_subject(check.run(facts, prof))[subject]  # type: ignore[attr-defined]


def test_healthy_h100_node_passes_every_gpu_check(h100: Profile) -> None:
    facts = nvml_node()
    for check in (COUNT, LOST, ECC_MODE, UNCORRECTED, CORRECTED, ROW_REMAP, PERSISTENCE, COMPUTE, MIG, POWER_LIMIT,
                  CLOCK_EVENTS, TEMPERATURE, MEMORY_TEMPERATURE, IMBALANCE, LINK, REPLAY, LINKS, ERRORS, FABRIC,
                  VBIOS, INFOROM, DRIVER, CUDA, RECOVERY):
        findings = check.run(facts, h100)
        assert findings, check.id
        assert {f.status for f in findings} == {Status.PASS}, [f.message for f in findings]
    # Hopper has no page retirement: skipped with the reason, not passed or failed.
    assert {f.status for f in RETIRED.run(facts, h100)} == {Status.SKIP}


def test_ecc_off_with_enable_pending_says_reboot(h100: Profile) -> None:
    facts = nvml_node([gpu_facts(0), gpu_facts(3, ecc_mode="disabled", ecc_pending="enabled")])
    finding = one(facts, h100, ECC_MODE, "gpu3")
    assert finding.status is Status.WARN and "reboot to apply" in finding.message and finding.action == "reboot"
    off = nvml_node([gpu_facts(1, ecc_mode="disabled", ecc_pending="disabled")])
    failed = one(off, h100, ECC_MODE, "gpu1")
    assert failed.status is Status.FAIL and failed.severity is Severity.CRITICAL
    flipping = nvml_node([gpu_facts(2, ecc_mode="enabled", ecc_pending="disabled")])
    assert one(flipping, h100, ECC_MODE, "gpu2").status is Status.WARN


def test_uncorrected_ecc_is_critical(h100: Profile) -> None:
    facts = nvml_node([gpu_facts(0, ecc_volatile_uncorrected=2)])
    finding = one(facts, h100, UNCORRECTED, "gpu0")
    assert finding.status is Status.FAIL and finding.severity is Severity.CRITICAL and finding.observed == 2


def test_retired_pages_pending_on_volta(h100: Profile) -> None:
    volta = gpu_facts(0, retired_sbe=3, retired_dbe=1, retired_pending=True)
    finding = one(nvml_node([volta]), h100, RETIRED, "gpu0")
    assert finding.status is Status.WARN and "pending" in finding.message and finding.action == "reset_gpu"
    many = gpu_facts(0, retired_sbe=50, retired_dbe=20, retired_pending=False)
    assert one(nvml_node([many]), h100, RETIRED, "gpu0").status is Status.FAIL


def test_row_remap_pending_failure_and_threshold(h100: Profile) -> None:
    pending = one(nvml_node([gpu_facts(5, remapped_uncorrectable=1, remap_pending=True)]), h100, ROW_REMAP, "gpu5")
    assert pending.status is Status.WARN and pending.action == "reset_gpu" and "reset the GPU" in pending.message
    failure = one(nvml_node([gpu_facts(0, remap_failure=True)]), h100, ROW_REMAP, "gpu0")
    assert failure.status is Status.FAIL and failure.severity is Severity.CRITICAL
    assert failure.action == "contact_support"
    many = one(nvml_node([gpu_facts(0, remapped_uncorrectable=9)]), h100, ROW_REMAP, "gpu0")
    assert many.status is Status.FAIL


def test_modes(h100: Profile) -> None:
    facts = nvml_node([gpu_facts(0, persistence_mode="disabled"), gpu_facts(1, compute_mode="Exclusive_Process"),
                       gpu_facts(2, mig_mode="disabled", mig_pending="enabled")])
    assert one(facts, h100, PERSISTENCE, "gpu0").status is Status.FAIL
    assert one(facts, h100, COMPUTE, "gpu1").status is Status.FAIL
    mig = one(facts, h100, MIG, "gpu2")
    assert mig.status is Status.WARN and "pending" in mig.message


def test_power_limit_relative_to_the_default(h100: Profile) -> None:
    capped = one(nvml_node([gpu_facts(2, power_limit_w=500.0)]), h100, POWER_LIMIT, "gpu2")
    assert capped.status is Status.FAIL
    assert capped.expected == {"min": 700}  # resolved from the GPU's own default limit
    assert "default 700 W" in capped.message
    a100 = one(nvml_node([gpu_facts(0, power_limit_w=400.0, default_limit_w=400.0)]), h100, POWER_LIMIT, "gpu0")
    assert a100.status is Status.PASS  # the reference adapts to each GPU model
    no_default = gpu_facts(0, default_limit_w=Unsupported("not supported"))
    assert one(nvml_node([no_default]), h100, POWER_LIMIT, "gpu0").status is Status.SKIP
    unreadable = gpu_facts(0, default_limit_w=Unknown("nvmlDeviceGetPowerManagementDefaultLimit: Unknown Error"))
    finding = one(nvml_node([unreadable]), h100, POWER_LIMIT, "gpu0")
    assert finding.status is Status.UNKNOWN and "Unknown Error" in finding.message


def test_clock_events_severity_per_reason(h100: Profile) -> None:
    brake = one(nvml_node([gpu_facts(0, clock_events=0x1 | 0x80)]), h100, CLOCK_EVENTS, "gpu0")
    assert brake.status is Status.FAIL and brake.severity is Severity.CRITICAL
    assert "hw_power_brake" in brake.message and brake.action == "check_power_delivery"
    sw = one(nvml_node([gpu_facts(0, clock_events=0x20)]), h100, CLOCK_EVENTS, "gpu0")
    assert sw.status is Status.FAIL and sw.severity is Severity.WARNING
    capped = one(nvml_node([gpu_facts(0, clock_events=0x4)]), h100, CLOCK_EVENTS, "gpu0")
    assert capped.status is Status.PASS  # SW power capping under load is normal
    old = one(nvml_node([gpu_facts(0, clock_events=Unsupported("no API"))]), h100, CLOCK_EVENTS, "gpu0")
    assert old.status is Status.SKIP


def test_temperature_against_the_devices_own_threshold(h100: Profile) -> None:
    hot = one(nvml_node([gpu_facts(0, temperature_c=81)]), h100, TEMPERATURE, "gpu0")
    assert hot.status is Status.FAIL and hot.expected == {"max": 79}
    assert "slowdown_c - 10" in hot.message
    lower = one(nvml_node([gpu_facts(0, temperature_c=81, slowdown_c=95)]), h100, TEMPERATURE, "gpu0")
    assert lower.status is Status.PASS
    hbm = one(nvml_node([gpu_facts(0, memory_temperature_c=91)]), h100, MEMORY_TEMPERATURE, "gpu0")
    assert hbm.status is Status.FAIL


def test_thermal_imbalance_flags_the_hot_half(h100: Profile) -> None:
    gpus = [gpu_facts(i, temperature_c=34 if i < 4 else 44) for i in range(8)]
    findings = IMBALANCE.run(nvml_node(gpus), h100)
    # Median of four 34s and four 44s is 39: nobody is 8 C above it yet.
    assert {f.status for f in findings} == {Status.PASS}
    gpus = [gpu_facts(i, temperature_c=34 if i < 6 else 44) for i in range(8)]
    result = statuses(IMBALANCE.run(nvml_node(gpus), h100))
    assert result == {f"gpu{i}": Status.PASS if i < 6 else Status.FAIL for i in range(8)}


def test_pcie_width_not_generation(h100: Profile) -> None:
    idle = one(nvml_node([gpu_facts(0, pcie_gen=1)]), h100, LINK, "gpu0")
    assert idle.status is Status.PASS
    narrow = one(nvml_node([gpu_facts(0, pcie_width=8)]), h100, LINK, "gpu0")
    assert narrow.status is Status.FAIL and narrow.expected == {"min": 16}


def test_pcie_replays_are_a_rate(h100: Profile) -> None:
    few = one(nvml_node([gpu_facts(0, pcie_replays=7)]), h100, REPLAY, "gpu0")
    assert few.status is Status.PASS
    facts = nvml_node([gpu_facts(0, pcie_replays=5000)])
    bad = one(facts, h100, REPLAY, "gpu0")
    assert bad.status is Status.FAIL and bad.observed == 500.0  # 5000 over 10 hours
    no_uptime = nvml_node([gpu_facts(0, pcie_replays=7)], host_facts=host(uptime_s=Unknown("no /proc/uptime")))
    assert one(no_uptime, h100, REPLAY, "gpu0").status is Status.UNKNOWN


def test_nvlink_links_errors_and_fabric(h100: Profile) -> None:
    down = one(nvml_node([gpu_facts(6, nvlink_states=(1,) * 16 + (0, 0))]), h100, LINKS, "gpu6")
    assert down.status is Status.FAIL and down.observed == 16 and "links down: 16, 17" in down.message
    errors = gpu_facts(0, nvlink_errors={"crc_flit": 0, "crc_data": 0, "replay": 90, "recovery": 20})
    assert one(nvml_node([errors]), h100, ERRORS, "gpu0").status is Status.FAIL
    fabric = one(nvml_node([gpu_facts(0, fabric_state="in_progress")]), h100, FABRIC, "gpu0")
    assert fabric.status is Status.FAIL
    status = one(nvml_node([gpu_facts(0, fabric_status="NVML error 999")]), h100, FABRIC, "gpu0")
    assert status.status is Status.FAIL and "NVML error 999" in status.message
    pcie_card = gpu_facts(0, nvlink_states=Unsupported("no NVLink on this GPU"))
    assert one(nvml_node([pcie_card]), h100, LINKS, "gpu0").status is Status.SKIP


def test_vbios_minimum_hex_and_consistency(h100: Profile) -> None:
    gpus = [gpu_facts(i) for i in range(7)] + [gpu_facts(7, vbios="96.00.5A.00.01")]
    result = by_subject(VBIOS.run(nvml_node(gpus), h100))
    assert result["gpu7"].status is Status.FAIL  # 0x5A < 0x74
    newer = [gpu_facts(i) for i in range(7)] + [gpu_facts(7, vbios="96.00.A5.00.01")]
    mixed = by_subject(VBIOS.run(nvml_node(newer), h100))["gpu7"]
    assert mixed.status is Status.FAIL and "differs from 96.00.74.00.01 on 7 other" in mixed.message


def test_inforom_driver_mismatch_and_cuda(h100: Profile) -> None:
    bad = one(nvml_node([gpu_facts(0, inforom_valid="nvmlDeviceValidateInforom: Corrupted infoROM")]), h100,
              INFOROM, "gpu0")
    assert bad.status is Status.FAIL
    mismatch = nvml_node(host_facts=host(nvidia_driver="535.129.03", uptime_s=1.0))
    (finding,) = DRIVER.run(mismatch, h100)
    assert finding.status is Status.FAIL and "version mismatch" in finding.message
    (cuda,) = CUDA.run(nvml_node(), h100)
    assert cuda.status is Status.PASS and cuda.observed == "12.4"


def test_lost_gpu_and_count(h100: Profile) -> None:
    from agent.core.facts import GpuFacts

    gpus = [gpu_facts(i) for i in range(7)] + [GpuFacts(index=7, lost="nvmlDeviceGetHandleByIndex: GPU is lost")]
    facts = nvml_node(gpus)
    lost = by_subject(LOST.run(facts, h100))
    assert lost["gpu7"].status is Status.FAIL and lost["gpu7"].severity is Severity.CRITICAL
    assert lost["gpu0"].status is Status.PASS
    # Other checks leave the lost GPU to gpu.lost instead of repeating unknowns.
    assert "gpu7" not in statuses(TEMPERATURE.run(facts, h100))
    count = by_subject(COUNT.run(facts, h100))
    assert count["node"].status is Status.PASS  # NVML still counts the lost GPU
    assert count["pci"].status is Status.PASS


def test_gpu_on_pci_missing_from_nvml_is_critical(h100: Profile) -> None:
    on_pci = tuple(pci_gpu(f"0000:{b}:00.0") for b in ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"])
    facts = nvml_node([gpu_facts(i) for i in range(7)], host_facts=host(pci=on_pci, uptime_s=100.0))
    count = by_subject(COUNT.run(facts, h100))
    assert count["node"].status is Status.FAIL  # 7 instead of 8
    assert count["pci"].status is Status.FAIL and "0000:db:00.0" in count["pci"].message


def test_recovery_action(h100: Profile) -> None:
    finding = one(nvml_node([gpu_facts(0, recovery_action=4)]), h100, RECOVERY, "gpu0")
    assert finding.status is Status.FAIL and finding.observed == "drain_and_reset" and finding.action == "drain"


def test_nvml_down_with_gpus_on_pci_makes_every_gpu_check_unknown(h100: Profile) -> None:
    facts = nvml_node()
    facts.nvml = Unknown("NVMLError_DriverNotLoaded: Driver Not Loaded")
    for check in (ECC_MODE, TEMPERATURE, LINKS):
        (finding,) = check.run(facts, h100)
        assert finding.status is Status.UNKNOWN and "Driver Not Loaded" in finding.message
    facts.sources["nvml"] = SourceStatus("nvml", ok=False, configured=False, error="not in snapshot")
    assert ECC_MODE.run(facts, h100) == []


XID_LOG = [
    "NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected",
    "NVRM: Xid (PCI:0000:19:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.",
    *["NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python3, Graphics Exception: ESR 0x51c730=0x0"] * 5,
    "NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:9b:00): 145, pid='<unknown>', name=<unknown>, NVLink: fatal",
    "NVRM: Xid (PCI:0000:cb:00): 999, pid='<unknown>', name=<unknown>, something new",
]


def test_xid_mapping_dedup_and_app_errors(h100: Profile) -> None:
    facts = nvml_node(xids=parse_xids([KmsgRecord(m) for m in XID_LOG]))
    result = by_subject(XID.run(facts, h100))
    assert result["gpu0"].status is Status.FAIL and result["gpu0"].severity is Severity.CRITICAL
    # Xid 48 with 63 on the same GPU: the catalogue's DRAIN_AND_RESET
    assert result["gpu0"].action == "drain" and result["gpu0"].observed == {"48": 1, "63": 1}
    app = result["gpu1"]
    assert app.status is Status.WARN and app.severity is Severity.INFO and app.observed == {"13": 5}
    assert "x5" in app.message  # de-duplicated, counted
    assert result["gpu7"].action == "drain" and result["gpu7"].status is Status.FAIL
    assert result["gpu4"].action == "reset_gpu" and "NVLink5" in result["gpu4"].message
    # an unknown code warns (contact_support); it does not fail the node
    assert result["gpu6"].status is Status.WARN and "not in nodewarden's table" in result["gpu6"].message
    assert result["gpu6"].action == "contact_support"
    assert result["gpu2"].status is Status.PASS


def test_xid_profile_override() -> None:
    assert lookup(94, {"94": {"severity": "critical", "action": "drain"}}).severity is Severity.CRITICAL
    prof = profile({"gpu": {"xid": {"13": {"severity": "warning", "action": "restart_app", "reason": "noisy app"}}}})
    facts = nvml_node(xids=parse_xids([KmsgRecord(XID_LOG[2])]))
    finding = by_subject(XID.run(facts, prof))["gpu1"]
    assert finding.severity is Severity.WARNING and finding.reason == "Xid 13: noisy app"


def test_xid_without_nvml_uses_pci_order() -> None:
    facts = node(host(uptime_s=1.0), xids=parse_xids([KmsgRecord(XID_LOG[0])]))
    assert by_subject(XID.run(facts, profile({})))["gpu0"].status is Status.FAIL
