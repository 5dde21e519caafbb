"""RDMA ports, PCIe links and ACS, IOMMU and GPU <-> NIC topology: parsers, checks, ACS remediation, CLI."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import AcsControl, IommuFacts, PciFunction, RdmaDevice, RdmaPort
from agent.core.model import Status, Unknown
from agent.sources.fsroot import LiveFs
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.pcie import (
    ConfigSpaceError,
    find_ext_capability,
    iommu_mode,
    parse_acs,
    path_between,
    peer_bridges,
    read_acs,
    read_iommu,
)
from agent.sources.rdma import parse_counter, parse_port_state, rate_gbps, read_rdma_devices
from checks.ib import FIRMWARE, HCA_COUNT, PORT_ERRORS, PORT_RATE, PORT_STATE
from checks.pcie_paths import ACS, IOMMU, LINK
from checks.topology import GPU_NIC
from tests.conftest import RunCli
from tests.factories import exp, gpu, host, node, profile, write_tree

# --- kernel formats ------------------------------------------------------------------------------


def test_port_attribute_parsers() -> None:
    assert parse_port_state("4: ACTIVE\n") == "ACTIVE"
    assert parse_port_state("5: LinkUp") == "LinkUp"
    assert parse_port_state("3: Disabled") == "Disabled"
    with pytest.raises(ValueError):
        parse_port_state("ACTIVE")
    assert rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    with pytest.raises(ValueError):
        rate_gbps("unknown")
    assert parse_counter("7\n") == 7
    assert parse_counter("N/A (no PMA)\n") == "N/A (no PMA)"


HCA = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:1a:00.0"


def rdma_tree(root: Path, *, rate: str | None = "400 Gb/sec (4X NDR)", link_downed: str = "0") -> LiveFs:
    port = f"{HCA}/infiniband/mlx5_0/ports/1"
    files: dict[str, str | bytes] = {
        f"{HCA}/infiniband/mlx5_0/hca_type": "MT4129\n", f"{HCA}/infiniband/mlx5_0/fw_ver": "28.39.2048\n",
        f"{HCA}/infiniband/mlx5_0/board_id": "MT_0000000838\n",
        f"{port}/state": "4: ACTIVE\n", f"{port}/phys_state": "5: LinkUp\n", f"{port}/link_layer": "Ethernet\n",
        f"{port}/counters/link_downed": link_downed, f"{port}/counters/symbol_error": "0\n",
        f"{port}/hw_counters/out_of_buffer": "3\n", f"{port}/gid_attrs/ndevs/0": "enp26s0np0\n",
        f"{HCA}/net/enp26s0np0/mtu": "9000\n",
    }
    if rate is not None:
        files[f"{port}/rate"] = rate
    write_tree(root, files)
    (root / "sys/class/infiniband").mkdir(parents=True)
    os.symlink("../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:1a:00.0/infiniband/mlx5_0",
               root / "sys/class/infiniband/mlx5_0")
    os.symlink("../../../0000:1a:00.0", root / HCA / "infiniband/mlx5_0/device")
    return LiveFs(str(root))


def test_read_rdma_devices_in_kernel_format(tmp_path: Path) -> None:
    devices = read_rdma_devices(rdma_tree(tmp_path, link_downed="N/A (no PMA)\n"))
    assert not isinstance(devices, Unknown)
    (device,) = devices
    assert (device.name, device.hca_type, device.fw_ver, device.board_id, device.pci_address) == (
        "mlx5_0", "MT4129", "28.39.2048", "MT_0000000838", "0000:1a:00.0")
    assert not isinstance(device.ports, Unknown)
    (port,) = device.ports
    assert (port.state, port.phys_state, port.rate, port.link_layer, port.netdev) == (
        "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "Ethernet", "enp26s0np0")
    assert port.counters == {"link_downed": "N/A (no PMA)", "symbol_error": 0}
    assert port.hw_counters == {"out_of_buffer": 3} and port.problems == ()


def test_half_populated_port_and_missing_rdma_stack(tmp_path: Path) -> None:
    devices = read_rdma_devices(rdma_tree(tmp_path / "a", rate=None))
    assert not isinstance(devices, Unknown) and not isinstance(devices[0].ports, Unknown)
    port = devices[0].ports[0]
    assert isinstance(port.rate, Unknown) and port.rate.reason.endswith("ports/1/rate is absent")
    assert port.problems == (port.rate.reason,)
    (tmp_path / "b").mkdir()
    assert read_rdma_devices(LiveFs(str(tmp_path / "b"))) == ()  # no RDMA stack: no devices, no error


# --- config space and ACS --------------------------------------------------------------------------


def config_space(control: int | None = 0x0000, size: int = 4096, acs_at: int = 0x148) -> bytes:
    """Type 1 header + AER at 0x100 -> (ACS at acs_at) -> DPC at 0x220, as a PEX890xx port carries them."""
    cfg = bytearray(size)
    struct.pack_into("<HH", cfg, 0, 0x1000, 0xC030)
    if size <= 0x100:
        return bytes(cfg)
    chain = [(0x100, 0x0001)] + ([(acs_at, 0x000D)] if control is not None else []) + [(0x220, 0x001D)]
    for index, (offset, cap) in enumerate(chain):
        following = chain[index + 1][0] if index + 1 < len(chain) else 0
        struct.pack_into("<I", cfg, offset, cap | 1 << 16 | following << 20)
    if control is not None:
        struct.pack_into("<HH", cfg, acs_at + 4, 0x005F, control)
    return bytes(cfg)


def test_acs_capability_walk() -> None:
    assert find_ext_capability(config_space(), 0x000D) == 0x148
    assert parse_acs(config_space(0x001D)) == AcsControl(0x148, 0x001D)
    assert parse_acs(config_space(0x001D)).redirects  # type: ignore[union-attr]
    assert not parse_acs(config_space(0x0001)).redirects  # type: ignore[union-attr]  # source validation only
    assert parse_acs(config_space(None)) is None  # no ACS capability in the list
    assert parse_acs(config_space(None, size=256)) is None  # conventional config space
    with pytest.raises(ConfigSpaceError, match="needs root"):
        parse_acs(config_space()[:64])  # what a non-root read of sysfs config returns
    with pytest.raises(ConfigSpaceError, match="short"):
        parse_acs(config_space()[:0x120])
    looped = bytearray(config_space(None))  # AER -> DPC -> back to AER, no ACS on the way
    struct.pack_into("<I", looped, 0x220, 0x001D | 1 << 16 | 0x100 << 20)
    with pytest.raises(ConfigSpaceError, match="malformed"):
        parse_acs(bytes(looped))
    assert AcsControl(0x148, 0x001D).describe().startswith("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+")


def test_read_acs_short_and_missing_config(tmp_path: Path) -> None:
    write_tree(tmp_path, {"sys/bus/pci/devices/0000:17:02.0/config": config_space()[:64]})
    fs = LiveFs(str(tmp_path))
    short = read_acs(fs, "0000:17:02.0")
    assert isinstance(short, Unknown) and "config space not readable: needs root" in short.reason
    missing = read_acs(fs, "0000:17:03.0")
    assert isinstance(missing, Unknown) and missing.reason.endswith("config is absent")


# --- topology and IOMMU -----------------------------------------------------------------------------


def bridge(address: str, parent: str | None, numa: int = 0) -> PciFunction:
    return PciFunction(address, 0x1000, 0xC030, 0x060400, numa_node=numa, parent=parent)


TREE = (
    bridge("0000:15:01.0", None), bridge("0000:16:00.0", "0000:15:01.0"),
    bridge("0000:17:01.0", "0000:16:00.0"), bridge("0000:17:02.0", "0000:16:00.0"),
    gpu("0000:19:00.0")._replace(parent="0000:17:01.0"),
    PciFunction("0000:1a:00.0", 0x15B3, 0x1021, 0x020000, numa_node=0, parent="0000:17:02.0"),
    bridge("0000:37:01.0", None), bridge("0000:38:00.0", "0000:37:01.0"), bridge("0000:39:02.0", "0000:38:00.0"),
    PciFunction("0000:3c:00.0", 0x15B3, 0x1021, 0x020000, numa_node=0, parent="0000:39:02.0"),
    bridge("0000:97:01.0", None, 1), bridge("0000:98:00.0", "0000:97:01.0", 1),
    bridge("0000:99:02.0", "0000:98:00.0", 1),
    PciFunction("0000:9c:00.0", 0x15B3, 0x1021, 0x020000, numa_node=1, parent="0000:99:02.0"),
    PciFunction("0000:15:02.0", 0x15B3, 0x1021, 0x020000, numa_node=0, parent="0000:15:01.0"),
)
BY_ADDRESS = {f.address: f for f in TREE}


def test_path_levels_like_nvidia_smi_topo() -> None:
    assert path_between("0000:19:00.0", "0000:1a:00.0", BY_ADDRESS) == ("PIX", ["0000:17:01.0", "0000:17:02.0"])
    assert path_between("0000:19:00.0", "0000:15:02.0", BY_ADDRESS)[0] == "PHB"  # through the root port
    assert path_between("0000:19:00.0", "0000:3c:00.0", BY_ADDRESS) == ("NODE", [])  # other root, same socket
    assert path_between("0000:19:00.0", "0000:9c:00.0", BY_ADDRESS) == ("SYS", [])  # the other socket
    rdma = [RdmaDevice("mlx5_0", pci_address="0000:1a:00.0"), RdmaDevice("mlx5_6", pci_address="0000:9c:00.0")]
    assert peer_bridges(TREE, rdma) == {"0000:17:01.0": [("0000:19:00.0", "0000:1a:00.0")],
                                        "0000:17:02.0": [("0000:19:00.0", "0000:1a:00.0")]}


def test_iommu_modes(tmp_path: Path) -> None:
    assert iommu_mode((), {"intel_iommu": "off"}, None)[0] == "off"
    assert iommu_mode(("dmar0",), {"intel_iommu": "on", "iommu": "pt"}, None)[0] == "passthrough"
    assert iommu_mode(("smmu3.0x0",), {"iommu.passthrough": "1"}, None)[0] == "passthrough"
    assert iommu_mode(("dmar0",), {"intel_iommu": "on"}, None)[0] == "translated"
    assert iommu_mode(("dmar0",), {"iommu": "pt"}, "DMA-FQ")[0] == "translated"  # the groups say what is real
    write_tree(tmp_path, {"sys/class/iommu/dmar0/x": "", "sys/kernel/iommu_groups/0/type": "identity\n"})
    facts = read_iommu(LiveFs(str(tmp_path)), "ro quiet")
    assert isinstance(facts, IommuFacts) and (facts.units, facts.mode) == (("dmar0",), "passthrough")
    assert "identity" in facts.why


# --- checks on hand-made facts ------------------------------------------------------------------------

RAIL_PROFILE = {
    "rdma": {"hca_types": ["MT4129"], "count": exp("critical", equals=2), "port_state": exp("critical", equals="ACTIVE/LinkUp"),
             "rate": exp(min=400), "firmware": exp(version_min="28.39.1002"),
             "errors": {"link_downed": exp(max=2), "link_error_recovery": exp(max=5)}},
    "pcie": {"acs": exp(equals="disabled"),
             "link": {"connectx-7": {"pci_ids": ["15b3:1021"], **exp(equals="full")}}},
    "iommu": {"mode": exp(one_of=["off", "passthrough"])},
    "topology": {"gpu_nic": exp(one_of=["PIX", "PXB"])},
}


def rail(name: str, address: str, fw: str = "28.39.2048", **port: Any) -> RdmaDevice:
    values: dict[str, Any] = {"state": "ACTIVE", "phys_state": "LinkUp", "rate": "400 Gb/sec (4X NDR)",
                              "link_layer": "Ethernet", "counters": {"link_downed": 0, "link_error_recovery": 0}}
    values.update(port)
    return RdmaDevice(name, "MT4129", "MT_0000000838", fw, address, (RdmaPort(1, **values),))


def facts(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "pci": TREE, "rdma": (rail("mlx5_0", "0000:1a:00.0"), rail("mlx5_6", "0000:9c:00.0")),
        "pcie_acs": {"0000:17:01.0": AcsControl(0x148, 0), "0000:17:02.0": AcsControl(0x148, 0)},
        "iommu": IommuFacts(("dmar0",), "passthrough", "iommu=pt"),
    }
    values.update(overrides)
    return node(host(**values))


def statuses(findings: list[Any]) -> dict[str, Status]:
    return {f.subject: f.status for f in findings}


def test_rail_checks_pass_on_a_healthy_layout() -> None:
    p = profile(RAIL_PROFILE)
    for check in (HCA_COUNT, PORT_STATE, PORT_RATE, PORT_ERRORS, FIRMWARE, ACS, IOMMU, GPU_NIC):
        findings = check.run(facts(), p)
        assert findings and {f.status for f in findings} == {Status.PASS}, (check.id, findings)


def test_port_state_rate_and_count() -> None:
    p = profile(RAIL_PROFILE)
    down = facts(rdma=(rail("mlx5_0", "0000:1a:00.0", state="DOWN", phys_state="Polling"),
                       rail("mlx5_6", "0000:9c:00.0", rate="200 Gb/sec (4X HDR)")))
    state = PORT_STATE.run(down, p)
    assert statuses(state) == {"mlx5_0/1": Status.FAIL, "mlx5_6/1": Status.PASS}
    assert state[0].observed == "DOWN/Polling" and state[0].action == "check_link"
    rate = PORT_RATE.run(down, p)
    assert statuses(rate)["mlx5_6/1"] is Status.FAIL and rate[1].observed == 200
    assert "(200 Gb/sec (4X HDR))" in rate[1].message and rate[1].expected == {"min": 400}
    (count,) = HCA_COUNT.run(facts(rdma=()), p)
    assert count.status is Status.FAIL and "RDMA stack" in count.message
    half = facts(rdma=(rail("mlx5_0", "0000:1a:00.0", rate=Unknown("ports/1/rate is absent")),))
    assert statuses(PORT_RATE.run(half, p)) == {"mlx5_0/1": Status.UNKNOWN}


def test_error_counters_flaps_na_and_saturation() -> None:
    p = profile(RAIL_PROFILE)
    flapping = facts(rdma=(rail("mlx5_0", "0000:1a:00.0", counters={"link_downed": 7, "link_error_recovery": 12}),))
    (finding,) = PORT_ERRORS.run(flapping, p)
    assert finding.status is Status.FAIL and finding.observed == {"link_downed": 7, "link_error_recovery": 12}
    assert "link_downed 7 (limit <= 2), link_error_recovery 12 (limit <= 5)" in finding.message
    na = facts(rdma=(rail("mlx5_0", "0000:1a:00.0", counters={"link_downed": "N/A (no PMA)"}),))
    (finding,) = PORT_ERRORS.run(na, p)
    assert finding.status is Status.UNKNOWN and "PMA" in finding.message
    saturated = facts(rdma=(rail("mlx5_0", "0000:1a:00.0", counters={"link_downed": 255}),))
    (finding,) = PORT_ERRORS.run(saturated, p)
    # saturated at 255: the true count is at least 255, far over the limit of 2, so it fails (issue 13 rule 6);
    # tests/unit/checks/test_gpu_judgement.py covers a limit at or above the maximum (unknown)
    assert finding.status is Status.FAIL and "link_downed at least 255 (8-bit maximum" in finding.message


def test_firmware_minimum_and_consistency() -> None:
    p = profile(RAIL_PROFILE)
    mixed = facts(rdma=(rail("mlx5_0", "0000:1a:00.0"), rail("mlx5_6", "0000:9c:00.0", fw="28.36.1010")))
    findings = FIRMWARE.run(mixed, p)
    assert statuses(findings) == {"mlx5_0": Status.PASS, "mlx5_6": Status.FAIL, "MT4129": Status.FAIL}
    assert "2 firmware versions" in findings[-1].message


def test_acs_link_iommu_topology_failures() -> None:
    p = profile(RAIL_PROFILE)
    acs = ACS.run(facts(pcie_acs={"0000:17:01.0": AcsControl(0x148, 0x1D),
                                  "0000:17:02.0": Unknown("config space not readable: needs root")}), p)
    assert statuses(acs) == {"0000:17:01.0": Status.FAIL, "0000:17:02.0": Status.UNKNOWN}
    assert acs[0].remediation == "acs" and "GPU 0000:19:00.0 <-> mlx5_0 (0000:1a:00.0)" in acs[0].message
    assert "needs root" in acs[1].message
    slow = TREE[5]._replace(current_link_speed="16.0 GT/s PCIe", current_link_width=16,
                            max_link_speed="32.0 GT/s PCIe", max_link_width=16)
    links = LINK.run(facts(pci=(*TREE[:5], slow)), p)
    assert statuses(links) == {"0000:1a:00.0": Status.FAIL}
    assert links[0].observed["state"] == "slower" and "16.0 GT/s PCIe x16 of 32.0 GT/s PCIe x16" in links[0].message
    (iommu,) = IOMMU.run(facts(iommu=IommuFacts(("dmar0",), "translated", "no iommu=pt")), p)
    assert iommu.status is Status.FAIL and "no iommu=pt" in iommu.message
    far = facts(rdma=(rail("mlx5_6", "0000:9c:00.0"),))
    (topo,) = GPU_NIC.run(far, p)
    assert (topo.subject, topo.status, topo.observed) == ("gpu0", Status.FAIL, "SYS")


# --- the simulated nodes through the real CLI --------------------------------------------------------

ONLY = ("--only", "ib.*", "--only", "pcie.*", "--only", "topology.*", "--only", "host.iommu")


def interconnect_audit(run_cli: RunCli, *source: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("audit", *source, *ONLY, "--format", "json")
    return result.code, result.json()


def test_cli_drifted_and_healthy_nodes(run_cli: RunCli) -> None:
    code, report = interconnect_audit(run_cli, "--simulate", "hgx-h100-drifted")
    assert code == 1
    bad = {(f["check"], f["subject"]) for f in report["findings"] if f["status"] not in ("pass", "skip")}
    assert bad == {("ib.port.rate", "mlx5_3/1"), ("ib.port.errors", "mlx5_4/1"), ("pcie.acs", "0000:b9:02.0")}
    checks = {f["check"] for f in report["findings"]}
    assert {"ib.hca.count", "ib.port.state", "ib.port.rate", "ib.port.errors", "ib.firmware", "pcie.link",
            "pcie.acs", "host.iommu", "topology.gpu_nic"} <= checks
    by_key = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert by_key[("ib.port.errors", "mlx5_4/1")]["observed"] == {"link_downed": 7, "link_error_recovery": 12}
    assert by_key[("pcie.acs", "0000:b9:02.0")]["remediation"] == "acs"
    assert by_key[("host.iommu", "node")]["observed"] == "passthrough"
    assert {f["observed"] for f in report["findings"] if f["check"] == "topology.gpu_nic"} == {"PIX"}
    for name in ("hgx-h100-healthy", "dgx-a100-healthy"):
        code, report = interconnect_audit(run_cli, "--simulate", name)
        assert code == 0 and report["summary"]["unknown"] == 0 and report["summary"]["fail"] == 0, name
        assert report["summary"]["pass"] >= 60


def test_unreadable_config_space_is_unknown_not_a_crash(run_cli: RunCli, drifted_copy: Path) -> None:
    fs = SnapshotFs(drifted_copy)
    real = fs.base / fs.resolve("/sys/bus/pci/devices/0000:17:01.0") / "config"
    data = real.read_bytes()
    real.unlink()  # hard-linked to other copies: replace, never write through
    real.write_bytes(data[:64])  # what a non-root capture records
    ib = drifted_copy / "fs" / fs.resolve("/sys/class/infiniband/mlx5_0") / "ports/1/counters/link_downed"
    ib.unlink()
    ib.write_text("N/A (no PMA)\n")
    start = time.monotonic()
    code, report = interconnect_audit(run_cli, "--snapshot", str(drifted_copy))
    assert time.monotonic() - start < 10 and code == 1  # the drifts still fail
    unknown = {(f["check"], f["subject"]): f["message"] for f in report["findings"] if f["status"] == "unknown"}
    assert set(unknown) == {("pcie.acs", "0000:17:01.0"), ("ib.port.errors", "mlx5_0/1")}
    assert "needs root" in unknown[("pcie.acs", "0000:17:01.0")]
    assert "N/A (no PMA)" in unknown[("ib.port.errors", "mlx5_0/1")]


def test_acs_remediation_apply_verify_rollback(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                empty_config: Path) -> None:
    fs = SnapshotFs(drifted_copy)
    config = fs.base / fs.resolve("/sys/bus/pci/devices/0000:b9:02.0") / "config"
    before = config.read_bytes()
    state = str(tmp_path / "state")
    common = ("--snapshot", str(drifted_copy), "--state-dir", state, "--config", str(empty_config), "--format",
              "json", "--only", "acs:*")
    plan = run_cli("remediate", *common).json()
    assert [(a["id"], a["status"], a["class"]) for a in plan["actions"]] == [
        ("acs:0000:b9:02.0", "not_allowed", "disruptive")]
    result = run_cli("remediate", *common, "--apply", "--allow", "disruptive")
    assert result.code == 0, result.stdout
    (action,) = result.json()["actions"]
    assert (action["status"], action["verified"], action["before"], action["observed_after"]) == (
        "applied", True, "enabled", "disabled")
    assert [(f["check"], f["subject"], f["status"]) for f in result.json()["findings"]] == [
        ("pcie.acs", "0000:b9:02.0", "fixed")]
    after = config.read_bytes()
    acs = parse_acs(after)
    assert acs is not None and acs.control == 0x0011  # SrcValid and UpstreamFwd kept, redirects cleared
    assert [i for i in range(len(before)) if before[i] != after[i]] == [acs.offset + 6]  # one byte of 0x1D -> 0x11
    code, audit = interconnect_audit(run_cli, "--snapshot", str(drifted_copy))
    assert code == 1  # rate and flaps remain
    assert not any(f["check"] == "pcie.acs" and f["status"] != "pass" for f in audit["findings"])
    back = run_cli("rollback", "--last", "--snapshot", str(drifted_copy), "--state-dir", state, "--format", "json")
    assert back.code == 0 and back.json()["restored"] == ["/sys/bus/pci/devices/0000:b9:02.0/config"]
    assert config.read_bytes() == before
