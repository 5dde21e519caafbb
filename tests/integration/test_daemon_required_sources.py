"""The daemon and the audit share one notion of a required source (issue 26, item 2).

A jump host without NVIDIA GPUs watching a BMC (as the README recommends): `nodewarden audit` said
`nvml: ... not needed` and exited 0, while `nodewarden daemon` on the same host exported
`nodewarden_source_up{source="nvml"} 0`, so NodewardenSourceDown fired after 10 minutes on every such
host. Both now judge through `agent.engine.audit.needed_sources`: NVML is not needed there, so it has no
`_up` series at all. The host is a recording of what such a machine shows live: PCI lists an Intel
bridge and nothing NVIDIA, no driver, and NVML fails for want of its library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunCli
from tests.daemon_peer import running_daemon
from tests.factories import write_tree
from tests.integration.test_monitoring import RULES, promtool
from tests.peers.redfish import mockup, sushy_static

DAEMON = {"job": "nodewarden", "instance": "jump1:9847"}
NO_LIBRARY = {"format": "nodewarden.nvml/v1", "devices": [],
              "system": {"nvmlDeviceGetCount": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}}}


def jump_host(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    snap = tmp_path / "jump1"
    write_tree(snap, {
        "meta.yaml": "hostname: jump1\ncaptured_at: '2026-12-01T10:00:00+00:00'\ncaptured: [host, kmsg, nvml]\n",
        "kmsg.txt": "6,1,0,-;Linux version 6.1.0 (gcc) #1 SMP\n",
        "fs/proc/sys/kernel/hostname": "jump1\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/device": "0x09a2\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
        "nvml.json": json.dumps(NO_LIBRARY),
        **(extra or {}),
    })
    return snap


def samples(body: str, name: str) -> dict[str, float]:
    return {s.labels.get("source", ""): s.value for family in text_string_to_metric_families(body)
            for s in family.samples if s.name == name}


def promtool_series(body: str) -> list[dict[str, str]]:
    """The exposition as promtool input series, each sample held for an hour."""
    out = []
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            labels = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted({**sample.labels, **DAEMON}.items()))
            out.append({"series": f"{sample.name}{{{labels}}}", "values": f"{sample.value:g}x60"})
    return out


def test_a_jump_host_daemon_exports_no_nvml_down_and_no_alert_fires(tmp_path: Path) -> None:
    snap = jump_host(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    password = tmp_path / "bmc-password"
    password.write_text("secret\n")
    password.chmod(0o600)
    with sushy_static(mockup("hpe-dl380a-gen11")) as bmc, running_daemon(
            tmp_path, "--snapshot", str(snap), "--config", str(config), "--bmc", bmc.url, "--bmc-user", "monitor",
            "--bmc-password-file", str(password)) as daemon:
        # The sensor poll may answer before the inventory walk that lists the BMC's GPUs: wait for the walk.
        body = daemon.wait_for(lambda: next((b for s, b in [daemon.scrape()] if s == 200 and samples(
            b, "nodewarden_source_up").get("redfish") == 1 and
            'nodewarden_profile_info{profile="nvidia-pcie"} 1.0' in b), None),
            what="the BMC's inventory walk and the profile its GPUs select")
    # Issue 22 item 9: the BMC lists 2 GPUs this host lacks and the host's identity is unreadable (no DMI):
    # the BMC's node is audited alone, so the host's sources are not in the audit (and NVML has no series).
    assert 'nodewarden_profile_info{profile="nvidia-pcie"} 1.0' in body
    # no nvml series; the ledger is the daemon's own memory of the node it watches, not a host source
    assert samples(body, "nodewarden_source_up") == {"redfish": 1, "ledger": 1}
    for family in ("nodewarden_source_pending", "nodewarden_source_duration_seconds",
                   "nodewarden_source_last_success_timestamp_seconds"):
        assert "nvml" not in samples(body, family), family
    assert 'nodewarden_checks{check="source.available",status="fail"}' not in body

    # The rule itself, over everything the daemon serves, for 20 minutes: NodewardenSourceDown stays silent.
    series = [*promtool_series(body), {"series": 'up{job="nodewarden", instance="jump1:9847"}', "values": "1x60"}]
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"name": "jump host", "interval": "1m", "input_series": series,
                       "alert_rule_test": [{"alertname": "NodewardenSourceDown", "eval_time": at, "exp_alerts": []}
                                           for at in ("11m", "20m")]}]}
    path = tmp_path / "jump_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def audit(run_cli: RunCli, snap: Path, config: Path, fmt: str) -> tuple[int, Any]:
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", fmt)
    return result.code, result.json() if fmt == "json" else result.stdout


def test_the_audit_says_the_same_as_the_daemon(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    snap = jump_host(tmp_path)
    code, report = audit(run_cli, snap, empty_config, "json")
    assert code == 0 and report["profile"] == "no-nvidia-gpu"
    nvml = report["sources"]["nvml"]
    assert nvml["configured"] is False and nvml["ok"] is False and nvml["needed"] is False
    assert nvml["error"].startswith("no NVIDIA GPU on PCI and no NVIDIA driver: not needed (")
    (finding,) = [f for f in report["findings"] if (f["check"], f["subject"]) == ("source.available", "nvml")]
    assert finding["status"] == "skip" and "not needed" in finding["message"]
    _code, prom = audit(run_cli, snap, empty_config, "prom")
    assert samples(prom, "nodewarden_source_up") == {"host": 1, "kmsg": 1}

    # Positive evidence only: with the NVIDIA driver loaded and no GPU on PCI (GPUs fallen off the bus),
    # NVML is needed and down.
    driver = jump_host(tmp_path / "driver", {"fs/proc/driver/nvidia/version":
                                             "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"})
    _code, prom = audit(run_cli, driver, empty_config, "prom")
    assert samples(prom, "nodewarden_source_up")["nvml"] == 0
