"""Live audit of the machine running the tests (no GPU, no BMC here).

The audit must finish (exit 0 or 1, never 3), report NVML as down and the
BMC as not configured, and observe exactly what the kernel's files say.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import RunCli

pytestmark = pytest.mark.live

SYSCTLS = ["vm.zone_reclaim_mode", "net.core.rmem_max", "net.core.wmem_max", "net.core.somaxconn", "vm.swappiness"]


@pytest.fixture
def live_config(tmp_path: Path) -> Path:
    """The generic profile, with overrides that make it observe every interface's MTU and more sysctls."""
    overrides = tmp_path / "overrides.yaml"
    sysctls = "".join(f"    {key}: {{min: 0, severity: info, reason: observe}}\n" for key in SYSCTLS)
    overrides.write_text(
        "expect:\n  sysctl:\n" + sysctls +
        "  network:\n    mtu:\n      every-interface:\n        match: {names: ['*'], bond_members: true}\n"
        "        expect: {min: 0, severity: info, reason: observe}\n")
    config = tmp_path / "config.yaml"
    # Forced: a machine without GPUs would otherwise get no-nvidia-gpu, which judges no host file.
    config.write_text(f"profile: generic-nvidia\noverrides_file: {overrides}\n")
    return config


def kernel_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def observations(report: dict) -> dict[tuple[str, str], object]:  # type: ignore[type-arg]
    return {(f["check"], f["subject"]): f["observed"] for f in report["findings"]
            if f["check"] in ("host.thp.enabled", "host.thp.defrag", "host.sysctl", "net.mtu")}


def test_live_audit_of_this_machine(run_cli: RunCli, live_config: Path) -> None:
    result = run_cli("audit", "--config", str(live_config), "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = result.json()
    assert report["node"]["mode"] == "live"
    assert report["sources"]["host"]["ok"] is True
    nvml = report["sources"]["nvml"]
    assert nvml["ok"] is False and nvml["configured"] is True and nvml["error"]
    assert report["sources"]["redfish"]["configured"] is False
    assert report["sources"]["ipmi"]["configured"] is False
    source_findings = {f["subject"]: f for f in report["findings"] if f["check"] == "source.available"}
    assert source_findings["nvml"]["status"] in ("fail", "warn")
    assert source_findings["redfish"]["status"] == "skip"

    observed = observations(report)
    enabled = re.search(r"\[(\w+)\]", kernel_text("/sys/kernel/mm/transparent_hugepage/enabled"))
    defrag = re.search(r"\[([\w+]+)\]", kernel_text("/sys/kernel/mm/transparent_hugepage/defrag"))
    assert enabled and defrag
    assert observed[("host.thp.enabled", "node")] == enabled.group(1)
    assert observed[("host.thp.defrag", "node")] == defrag.group(1)
    for key in SYSCTLS:
        value = " ".join(kernel_text("/proc/sys/" + key.replace(".", "/")).split())
        assert observed[("host.sysctl", key)] == value, key
    interfaces = sorted(os.listdir("/sys/class/net"))
    assert interfaces, "this machine has no network interfaces at all?"
    for name in interfaces:
        assert observed[("net.mtu", name)] == int(kernel_text(f"/sys/class/net/{name}/mtu")), name


def test_live_capture_replays_the_same_observations(run_cli: RunCli, live_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    captured = run_cli("snapshot", "capture", "--out", str(out))
    assert captured.code == 0, captured.stderr
    assert (out / "meta.yaml").is_file() and (out / "fs" / "proc").is_dir()
    live = run_cli("audit", "--config", str(live_config), "--format", "json").json()
    replay = run_cli("audit", "--snapshot", str(out), "--config", str(live_config), "--format", "json")
    assert replay.code in (0, 1), replay.stderr
    assert observations(replay.json()) == observations(live)
    assert replay.json()["node"]["hostname"] == live["node"]["hostname"]
