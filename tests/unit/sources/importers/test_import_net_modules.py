"""`snapshot import` of `ip -d link`, `ip -j link`, `ethtool` / `ethtool -i` and `lsmod` (issue 15): the host
facts under fs/ as the live reader sees them. Real captures from fixtures/real/linux/azhpc-diagnostics/,
synthetic samples in fixtures/import-samples/ (SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.host import read_interfaces, read_modules
from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
S = F / "import-samples"
AZ = F / "real" / "linux" / "azhpc-diagnostics"
LSPCI = F / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt"


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> dict[str, Any]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text())  # type: ignore[no-any-return]


def _findings(run_cli: RunCli, out: Path, config: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(out), "--config", str(config), "--format", "json")
    assert result.code in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return {(f["check"], f["subject"]): f for f in json.loads(result.stdout)["findings"]}


def test_real_lsmod_captures_become_proc_modules(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    for capture, loaded, absent in (("lsmod.centos.txt", {"nvidia", "nv_peer_mem", "gdrdrv", "mlx5_ib"}, set()),
                                    ("lsmod.nvidia.txt", {"nvidia", "nvidia_modeset", "nvidia_drm"},
                                     {"nvidia_uvm"})):
        out = tmp_path / capture
        meta = _import(run_cli, out, AZ / capture)
        assert meta["inputs"][0]["kind"] == "lsmod" and meta["host_parts"] == ["modules"]
        modules = read_modules(SnapshotFs(out))
        assert isinstance(modules, dict)
        assert loaded <= set(modules) and not absent & set(modules)
        assert all(state == "Live" for state in modules.values())
        findings = _findings(run_cli, out, empty_config)
        assert findings[("host.modules", "nvidia")]["status"] == "pass"
        uvm = findings[("host.modules", "nvidia_uvm")]
        assert uvm["status"] == ("pass" if "nvidia_uvm" in modules else "warn")


def test_real_ethtool_settings(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, AZ / "ethtool-eth1.txt")
    assert meta["inputs"][0]["kind"] == "ethtool"
    assert (out / "fs/sys/class/net/eth1/speed").read_text() == "54000\n"
    assert (out / "fs/sys/class/net/eth1/carrier").read_text() == "1\n"
    (eth1,) = read_interfaces(SnapshotFs(out))  # type: ignore[misc]
    assert eth1.name == "eth1" and eth1.speed_mbps == 54000


def test_ip_link_ethtool_i_and_lspci_give_the_interfaces(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, S / "ethtool-i.txt", S / "ip-d-link.txt", LSPCI)  # ethtool before lspci
    assert [e["kind"] for e in meta["inputs"]] == ["ethtool", "ip-link", "lspci"]
    assert "net" in meta["host_parts"]
    interfaces = read_interfaces(SnapshotFs(out))
    assert not isinstance(interfaces, type(None))
    by_name = {i.name: i for i in interfaces}  # type: ignore[union-attr]
    assert set(by_name) == {"lo", "enp27s0f0np0", "enp27s0f1np1", "enp26s0np0", "bond0", "bond0.100", "ib0",
                            "eno8303"}
    nic = by_name["enp26s0np0"]
    assert (nic.mtu, nic.operstate, nic.pci_address, nic.driver) == (1500, "up", "0000:1a:00.0", "mlx5_core")
    assert by_name["enp27s0f0np0"].bond_master == "bond0" and by_name["bond0"].is_bond
    assert (out / "fs/sys/class/net/bond0/bonding/mode").read_text() == "802.3ad 4\n"
    assert by_name["ib0"].arp_type == 32 and by_name["ib0"].operstate == "down"
    assert by_name["lo"].operstate == "unknown"
    links = json.loads((out / "fs_links.json").read_text())
    assert links["sys/class/net/bond0.100/lower_bond0"] == "../bond0"


def test_ip_json(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, S / "ip-j-link.json")
    assert meta["inputs"][0]["kind"] == "ip-link"
    by_name = {i.name: i for i in read_interfaces(SnapshotFs(out))}  # type: ignore[union-attr]
    assert (by_name["enp26s0np0"].mtu, by_name["enp26s0np0"].operstate) == (9000, "up")
    assert by_name["enp60s0np0"].operstate == "down"


def test_ethtool_i_without_an_interface_name_is_named_not_guessed(run_cli: RunCli, tmp_path: Path) -> None:
    plain = tmp_path / "driver-info.txt"
    plain.write_text("driver: mlx5_core\nversion: 24.04\nfirmware-version: 28.39.1002\n"
                     "expansion-rom-version: \nbus-info: 0000:1a:00.0\nsupports-statistics: yes\n")
    named = tmp_path / "ethtool_-i_enp26s0np0"
    named.write_bytes(plain.read_bytes())
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(plain), str(named), str(S / "ip-j-link.json"), "--out", str(out))
    assert result.code == 0, result.stderr
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    first, second, _ = meta["inputs"]
    assert any("does not name the interface" in s for s in first["skipped"])
    assert second["contributed"] and "enp26s0np0" in second["contributed"][0]
    assert json.loads((out / "fs_links.json").read_text()) == {
        "sys/class/net/enp26s0np0/device": "../../../bus/pci/devices/0000:1a:00.0"}
    by_name = {i.name: i for i in read_interfaces(SnapshotFs(out))}  # type: ignore[union-attr]
    assert by_name["enp26s0np0"].pci_address == "0000:1a:00.0"
    assert by_name["enp26s0np0"].driver is None  # the driver is the PCI function's: no lspci input here


def test_hostile_net_inputs(run_cli: RunCli, tmp_path: Path) -> None:
    bad = {
        "binary.out": b"\x7fELF" + bytes(range(256)) * 100,
        "ip-bad.json": b'[{"ifindex": 1, "ifname": "lo", "mtu": ' + b"[" * 100_000 + b"\n",
        "lsmod-long.txt": b"Module                  Size  Used by\nnvidia 1 0\n" + b"x" * (10 << 20) + b"\n",
        "ip-long.txt": b"1: lo: <LOOPBACK,UP> mtu 65536 qdisc noqueue state UNKNOWN\n    link/loopback 0\n"
                       + b"2: " + b"e" * (10 << 20) + b": <UP> mtu 1500\n",
    }
    paths = []
    for name, data in bad.items():
        path = tmp_path / name
        path.write_bytes(data)
        paths.append(path)
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", *(str(p) for p in paths), str(AZ / "lsmod.nvidia.txt"), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    by_name = {Path(e["name"]).name: e for e in meta["inputs"]}
    assert by_name["binary.out"]["kind"] == "unknown"
    error = by_name["ip-bad.json"].get("error")
    assert error and "\n" not in error
    assert any("ip-bad.json" in line for line in result.stderr.splitlines())
    assert by_name["lsmod.nvidia.txt"]["contributed"]
    assert all("error" in e or e.get("skipped") or e.get("contributed") for e in by_name.values())
