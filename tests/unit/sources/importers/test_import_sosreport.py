"""`snapshot import` of a sos report (issue 15), as a folder and as the tarball sos writes: the host files it
copied and the command outputs it ran become the host facts `audit --snapshot` judges. The tree under
fixtures/sosreport/ is synthetic (fixtures/SOURCES.md), laid out as sos 4.x writes it."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, RunCli

SOS = REPO / "fixtures" / "sosreport" / "sosreport-gpu-node-07-2024-11-05-qxbzkta"


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> tuple[dict[str, Any], str]:
    result = run_cli("snapshot", "import", "-v", *(str(p) for p in inputs), "--out", str(out))  # -v: every file
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text()), result.stdout


def _tarball(tmp_path: Path) -> Path:
    path = tmp_path / f"{SOS.name}.tar.xz"
    with tarfile.open(path, "w:xz") as archive:
        archive.add(SOS, arcname=SOS.name)
    return path


@pytest.mark.parametrize("form", ["folder", "tarball"])
def test_a_sos_report_becomes_the_host_facts_the_audit_judges(form: str, tmp_path: Path, run_cli: RunCli,
                                                              empty_config: Path) -> None:
    given = SOS if form == "folder" else _tarball(tmp_path)
    out = tmp_path / "snap"
    meta, stdout = _import(run_cli, out, given)
    fs = out / "fs"
    assert (fs / "proc/cmdline").read_text() == (SOS / "proc/cmdline").read_text()
    assert (fs / "proc/sys/vm/swappiness").read_text() == "60\n"  # copied file and sysctl -a agree
    assert (fs / "proc/sys/net/core/rmem_max").read_text() == "212992\n"  # from sysctl -a only
    assert (fs / "proc/sys/kernel/osrelease").read_text() == "5.15.0-119-generic\n"
    assert (fs / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "always [madvise] never\n"
    assert "nvidia 54677504 182" in (fs / "proc/modules").read_text()  # from lsmod: /proc/modules was not copied
    assert (fs / "sys/class/dmi/id/sys_vendor").read_text() == "Supermicro\n"
    assert (fs / "sys/class/net/ens1f0np0/mtu").read_text() == "9000\n"
    assert {"cmdline", "dmi", "modules", "sysctl", "thp", "net", "identity"} <= set(meta["host_parts"])
    assert meta["captured"] == ["host", "kmsg"]
    assert meta["hostname"] == "gpu-node-07" and meta["captured_at"] == "2024-11-05T10:21:03+00:00"
    kinds = {e["name"].rsplit("/", 2)[-2] + "/" + e["name"].rsplit("/", 1)[-1]: e for e in meta["inputs"]}
    assert kinds["kernel/dmesg"]["kind"] == "sosreport"
    assert kinds["kernel/dmesg"]["contributed"] == ["kernel-log: kmsg.txt: 5 record(s)"]
    assert kinds["kernel/dmesg_-T"]["skipped"] == ["another view of /sos_commands/kernel/dmesg: not used"]
    assert kinds["hardware/dmidecode"]["contributed"][0].startswith("dmidecode: /sys/class/dmi/id")
    assert kinds["log/messages"]["skipped"] == ["/var/log/messages: not used by the audit"]
    assert len((out / "kmsg.txt").read_text().splitlines()) == 5  # dmesg -T is the same records: not added twice
    for shown in ("(sosreport): kernel-log: kmsg.txt", "(sosreport): dmidecode: ", "(sosreport): /proc/cmdline",
                  "imported host, kmsg into"):
        assert shown in stdout

    result = run_cli("audit", "--snapshot", str(out), "--config", str(empty_config), "--format", "json")
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert report["node"]["hostname"] == "gpu-node-07"
    assert report["node"]["model"] == "Supermicro SYS-821GE-TNHR"
    assert report["node"]["kernel"] == "5.15.0-119-generic"
    status = {(f["check"], f["subject"]): f["status"] for f in report["findings"]}
    assert status[("host.numa.balancing", "node")] == "fail"  # kernel.numa_balancing = 1
    assert status[("host.sysctl", "net.core.rmem_max")] == "fail"
    assert status[("host.thp.enabled", "node")] == "pass"
    assert status[("host.modules", "nvidia")] == "pass"
    assert status[("gpu.xid", "pci:0000:19:00.0")] == "fail"  # the Xid 79 in dmesg


def test_a_folder_that_only_looks_like_one_is_read_by_content(tmp_path: Path, run_cli: RunCli) -> None:
    """proc/ or etc/ in a path is no sos report without sos_commands/ beside it: each file is detected as any input."""
    folder = tmp_path / "case" / "proc"
    folder.mkdir(parents=True)
    shutil.copyfile(SOS / "sos_commands/kernel/dmesg", folder / "dmesg.txt")
    (folder / "cmdline").write_text("ro quiet\n")
    meta, _stdout = _import(run_cli, tmp_path / "snap", tmp_path / "case")
    kinds = {Path(e["name"]).name: e["kind"] for e in meta["inputs"]}
    assert kinds == {"case": "folder", "dmesg.txt": "kernel-log", "cmdline": "unknown"}
    assert meta["captured"] == ["kmsg"] and not (tmp_path / "snap" / "fs").exists()
