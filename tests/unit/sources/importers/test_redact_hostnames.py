"""`snapshot capture --redact hostnames` redacts the host's own name whatever its length (issue 36, 2).

A recorded node (the drifted simulated node, renamed) is captured through the real CLI from its folder
(`--snapshot DIR`), as a user sends one: the name must be gone from every file as a value and as a token, the
words that merely contain it (`kvm`, `vmstat`, `vmlinuz`) must survive, and where it is the data's own word
(`up`, every NIC's operstate) the archive keeps it and says so.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from agent.sources.snapshot import simulated_path
from tests.conftest import RunCli

REDACT = "serials,uuids,hostnames,macs,ips,guids"
WORDS = ("kvm", "vmstat", "vmlinuz", "v5.15", "nvme")  # contain `v` or `vm`, are not the host


def _recorded_node(tmp_path: Path, name: str, fqdn: str) -> Path:
    """The drifted node as a recorded folder whose host is `name`, named in every place a capture holds it."""
    node = tmp_path / "node"
    shutil.copytree(simulated_path("hgx-h100-drifted"), node, symlinks=True)
    meta = yaml.safe_load((node / "meta.yaml").read_text())
    meta["hostname"] = name
    del meta["simulated"]
    (node / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    (node / "fs/proc/sys/kernel/hostname").write_text(name + "\n")
    (node / "fs/etc").mkdir(exist_ok=True)
    (node / "fs/etc/hostname").write_text(fqdn + "\n")
    system = node / "redfish/v1/Systems/System.Embedded.1/index.json"
    body = json.loads(system.read_text())
    body["HostName"] = name
    system.write_text(json.dumps(body, indent=1))
    with (node / "kmsg.txt").open("a") as kmsg:
        kmsg.write(f"6,900,16000000,-;systemd[1]: Set hostname to <{name}>.\n"
                   f"6,901,16000001,-;kvm: loaded on {name}; vmstat and nvme ok, root@{name}:~# uname v5.15\n"
                   f"6,902,16000002,-;sshd: connection to {fqdn} from {name}\n")
    return node


def _capture(run_cli: RunCli, tmp_path: Path, node: Path) -> tuple[dict[str, str], str]:
    out = tmp_path / "node.tar.gz"
    result = run_cli("snapshot", "capture", "--snapshot", str(node), "--out", str(out), "--redact", REDACT)
    assert result.code == 0, result.stderr
    with tarfile.open(out) as archive:
        files = {m.name.partition("/")[2]: archive.extractfile(m).read().decode("utf-8", "replace")  # type: ignore[union-attr]
                 for m in archive.getmembers() if m.isfile()}
    return files, result.stderr


def _token(name: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_.-])" + re.escape(name) + r"(?![A-Za-z0-9_-])")


@pytest.mark.parametrize("name", ["v", "vm", "gpu-node-07"])
def test_the_host_name_is_redacted_whatever_its_length(run_cli: RunCli, tmp_path: Path, name: str) -> None:
    fqdn = f"{name}.cluster.example"
    files, stderr = _capture(run_cli, tmp_path, _recorded_node(tmp_path, name, fqdn))
    meta = yaml.safe_load(files["meta.yaml"])
    assert meta["hostname"].startswith("redacted-host-")
    assert files["fs/proc/sys/kernel/hostname"].strip() == meta["hostname"]  # the same name, the same token
    assert files["fs/etc/hostname"].strip().startswith("redacted-host-")
    system = json.loads(next(t for n, t in files.items() if n.startswith("redfish/v1/Systems/")
                             and n.endswith("index.json") and '"HostName"' in t))
    assert system["HostName"] == meta["hostname"]
    left = {n: _token(name).findall(t) for n, t in files.items() if _token(name).search(t)}
    assert left == {}, left
    assert fqdn not in "".join(files.values())
    kmsg = files["kmsg.txt"]
    for word in WORDS:
        assert word in kmsg, word
    assert f"root@{meta['hostname']}:~#" in kmsg and "BOOT_IMAGE=/boot/vmlinuz-" in kmsg
    assert "redaction_notes" not in meta and "warning" not in stderr.lower()  # nothing had to be kept


def test_a_name_that_is_a_word_of_the_data_is_kept_there_and_said(run_cli: RunCli, tmp_path: Path,
                                                                  empty_config: Path) -> None:
    """A host named `up`: every NIC's operstate says `up` too; replacing it would take the NICs down."""
    node = _recorded_node(tmp_path, "up", "up.cluster.example")
    files, stderr = _capture(run_cli, tmp_path, node)
    meta = yaml.safe_load(files["meta.yaml"])
    assert meta["hostname"].startswith("redacted-host-")
    assert files["fs/proc/sys/kernel/hostname"].strip() == meta["hostname"]
    operstates = [t.strip() for n, t in files.items() if n.endswith("/net/bond0/operstate")]
    assert operstates == ["up"]
    assert "<up>" not in files["kmsg.txt"] and "root@up:" not in files["kmsg.txt"]  # the logs: by token
    notes = meta["redaction_notes"]
    assert len(notes) == 1 and "operstate" in notes[0] and "'up'" not in notes[0]  # where, never the name
    assert "warning" in stderr.lower() and "kept there" in stderr
    report = run_cli("audit", "--snapshot", str(tmp_path / "node.tar.gz"), "--config", str(empty_config),
                     "--format", "json")
    plain = run_cli("audit", "--snapshot", str(node), "--config", str(empty_config), "--format", "json")
    assert report.json()["summary"] == plain.json()["summary"]  # the NICs still up: the data unchanged
