"""Every conclusion tied to the file it came from (issue 15): a finding of an imported snapshot names the
inputs (and the bug report section) its facts came from; live audits and captures name none.

Through the real click CLI, on real captures from fixtures/ (see each folder's SOURCES.md); the bug report is
assembled from real sections as nvidia-bug-report.sh writes them (tests/unit/sources/importers/test_import_bundle.py)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.sources.importers.bug_report import SEPARATOR
from agent.sources.node import EVIDENCE_AREAS_MAX, EVIDENCE_REFS_MAX, snapshot_evidence
from agent.sources.snapshot import Snapshot
from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
LSPCI = F / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt"
NVIDIA_SMI = F / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
DMESG_IN_REPORT = F / "kmsg" / "dmesg.decode.iso.log.0"
DMESG = F / "kmsg" / "kmsg.1.log"
NVSMI_SECTION = "/usr/bin/nvidia-smi --query"


def _section(header: str, body: str, *, file: bool = False) -> bytes:
    lines = [SEPARATOR, "", header]
    if file:
        lines.append(f"*** ls: -r--r--r-- 1 root root 0 2024-07-31 11:22:39.000000000 +0000 {header[4:]}")
        lines.append(body.rstrip("\n"))
    else:
        lines += ["", body.rstrip("\n")]
    return gzip.compress(("\n".join(lines) + "\n\n").encode())


def _bug_report(path: Path) -> Path:
    prologue = (f"{SEPARATOR}\n\nStart of NVIDIA bug report log file.  Please include this file, along\n"
                "with a detailed description of your problem, when reporting a graphics\ndriver bug via the "
                "NVIDIA Linux forum (see devtalk.nvidia.com)\nor by sending email to 'linux-bugs@nvidia.com'.\n\n"
                "nvidia-bug-report.sh Version: 34097112\n\nDate: Wed Jul 31 11:22:39 UTC 2024\n\n")
    path.write_bytes(gzip.compress(prologue.encode())
                     + _section("*** /proc/cmdline", "BOOT_IMAGE=/vmlinuz-5.15.0-119-generic ro iommu=pt\n", file=True)
                     + _section("dmesg:", DMESG_IN_REPORT.read_text())
                     + _section(NVSMI_SECTION, NVIDIA_SMI.read_text()))
    return path


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> dict[str, Any]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    meta: dict[str, Any] = yaml.safe_load((out / "meta.yaml").read_text())
    return meta


def _audit(run_cli: RunCli, *args: str) -> dict[str, Any]:
    result = run_cli("audit", *args, "--format", "json")
    assert result.code in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _evidence(report: dict[str, Any], check: str) -> list[dict[str, str]]:
    found = [f for f in report["findings"] if f["check"] == check]
    assert found, check
    evidence: list[dict[str, str]] = found[0]["evidence"]
    assert all(f.get("evidence") == evidence for f in found)  # per fact area: the same for every subject
    return evidence


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    from click.testing import CliRunner

    from agent.apps.cli.main import cli

    tmp = tmp_path_factory.mktemp("evidence")
    report = _bug_report(tmp / "nvidia-bug-report.log.gz")
    out = tmp / "snap"
    result = CliRunner().invoke(cli, ["snapshot", "import", str(report), str(LSPCI), str(DMESG), "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return out, yaml.safe_load((out / "meta.yaml").read_text()), report


def test_each_finding_names_its_input_and_section(imported: tuple[Path, dict[str, Any], Path],
                                                  run_cli: RunCli) -> None:
    out, meta, _report = imported
    inner = next(e["name"] for e in meta["inputs"] if e["kind"] == "nvidia-bug-report")
    report = _audit(run_cli, "--snapshot", str(out))
    # NVML facts: the bug report's nvidia-smi section
    for check in ("gpu.count", "gpu.driver", "gpu.temperature"):
        assert _evidence(report, check) == [{"file": inner, "kind": "nvidia-bug-report", "section": NVSMI_SECTION}]
    # PCI facts: the separate lspci file, no section
    for check in ("pcie.link", "host.gpu.pci_count"):
        assert _evidence(report, check) == [{"file": str(LSPCI), "kind": "lspci"}]
    # the kernel log: the bug report's dmesg section and the separate kernel log, both fed it
    assert _evidence(report, "gpu.xid") == [{"file": inner, "kind": "nvidia-bug-report", "section": "dmesg:"},
                                            {"file": str(DMESG), "kind": "kernel-log"}]
    # a host file the bug report holds as a file section
    assert _evidence(report, "host.kernel.cmdline") == [
        {"file": inner, "kind": "nvidia-bug-report", "section": "*** /proc/cmdline"}]
    # what no input gave names nothing (the field is omitted, never an empty list)
    sysctl = [f for f in report["findings"] if f["check"] == "host.sysctl"]
    assert sysctl and all("evidence" not in f and f["status"] == "skip" for f in sysctl)
    assert not any(f.get("evidence") == [] for f in report["findings"])
    names = {e["name"] for e in meta["inputs"]}
    assert {e["file"] for f in report["findings"] for e in f.get("evidence", [])} <= names


def test_table_shows_evidence_only_with_v_and_junit_in_properties(imported: tuple[Path, dict[str, Any], Path],
                                                                  run_cli: RunCli) -> None:
    out, meta, _report = imported
    inner = next(e["name"] for e in meta["inputs"] if e["kind"] == "nvidia-bug-report")
    plain = run_cli("audit", "--snapshot", str(out), "--format", "table")
    assert plain.code in (0, 1) and "from: " not in plain.stdout
    # a terminal wide enough for the long temporary paths (the table wraps lines to the terminal: issue 26.6)
    verbose = run_cli("-v", "audit", "--snapshot", str(out), "--format", "table", env={"COLUMNS": "400"})
    assert f"from: {inner} ({NVSMI_SECTION})" in verbose.stdout
    assert f"from: {LSPCI}\n" in verbose.stdout
    junit = run_cli("audit", "--snapshot", str(out), "--format", "junit")
    root = ET.fromstring(junit.stdout)  # noqa: S314 - our own output
    case = next(c for c in root.iter("testcase") if c.get("classname") == "gpu.count")
    values = [p.get("value") for p in case.iter("property") if p.get("name") == "evidence"]
    assert values == [f"{inner} ({NVSMI_SECTION}) [nvidia-bug-report]"]


def test_archive_members_are_named_archive_colon_member(tmp_path: Path, run_cli: RunCli) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as archive:
        for name, source in (("case-123/lspci-vvv.txt", LSPCI), ("case-123/dmesg.txt", DMESG)):
            data = source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    out = tmp_path / "snap"
    _import(run_cli, out, bundle)
    report = _audit(run_cli, "--snapshot", str(out))
    assert _evidence(report, "pcie.link") == [{"file": f"{bundle}:case-123/lspci-vvv.txt", "kind": "lspci"}]
    assert _evidence(report, "gpu.xid") == [{"file": f"{bundle}:case-123/dmesg.txt", "kind": "kernel-log"}]


def _rewrite_meta(out: Path, evidence: Any) -> None:
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    meta["evidence"] = evidence
    (out / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=200))


def test_hostile_meta_evidence_is_bounded_and_cleaned(tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, LSPCI, DMESG)
    evil = "\x1b[2J\x1b]0;owned\x07lspci\r\nfail gpu.count\u202e"  # (YAML refuses a lone surrogate)
    many = [{"file": f"f{i}", "kind": "lspci"} for i in range(20_000)]  # about what 1 MiB of meta.yaml holds
    _rewrite_meta(out, {
        "host.pci": [{"file": evil, "kind": evil, "section": evil}, {"file": "x" * 10_000, "kind": "k" * 500},
                     "a string", 7, None, {"file": 3, "kind": "lspci"}, {"file": "ok", "kind": ["list"]},
                     {"file": "", "kind": "lspci"}, {"file": "s", "kind": "lspci", "section": {"a": 1}}],
        "host.pci_links": many,
        "kmsg": "not a list", 7: [{"file": "int key", "kind": "x"}], "nvml": {"file": "a", "kind": "b"},
        "z" * 1000: [{"file": "long area", "kind": "x"}],
    })
    report = _audit(run_cli, "--snapshot", str(out))
    pci = _evidence(report, "host.gpu.pci_count")
    assert pci[0] == {"file": pci[0]["file"], "kind": pci[0]["kind"], "section": pci[0]["section"]}
    assert not any(c in value for value in pci[0].values() for c in "\x1b\x07\r\n\u202e\ud800")
    assert pci[0]["file"].startswith("\\x1b[2J\\x1b]0;owned\\x07lspci\\r\\n")  # shown escaped, as all text from outside
    assert len(pci[1]["file"]) == 300 and len(pci[1]["kind"]) == 64
    assert pci[2:] == [{"file": "s", "kind": "lspci"}]  # wrong types dropped; a bad section is no section
    assert len(_evidence(report, "pcie.link")) == EVIDENCE_REFS_MAX  # pci + pci_links, capped per finding
    xid = [f for f in report["findings"] if f["check"] == "gpu.xid"]
    assert xid and all("evidence" not in f for f in xid)
    for fmt in ("table", "junit"):
        result = run_cli("-v", "audit", "--snapshot", str(out), "--format", fmt)
        assert result.code in (0, 1) and "Traceback" not in result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\u202e" not in result.stdout
    ET.fromstring(result.stdout)  # noqa: S314 - our own output, still XML a parser reads

    _rewrite_meta(out, ["not", "a", "mapping"])
    report = _audit(run_cli, "--snapshot", str(out))
    assert not any("evidence" in f for f in report["findings"])


def test_a_million_entries_never_a_traceback(tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, DMESG)
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    text = yaml.safe_dump(meta, sort_keys=False) + "evidence:\n  kmsg: [" + "0," * 1_000_000 + "0]\n"
    del meta
    (out / "meta.yaml").write_text(text, encoding="utf-8")
    result = run_cli("audit", "--snapshot", str(out), "--format", "json")
    assert result.code == 2 and "Traceback" not in result.stderr and "meta.yaml" in result.stderr
    # in memory (no file cap in the way): read back bounded, and fast
    huge = {f"host.p{i}": [{"file": "f", "kind": "k"}] * 3 for i in range(1_000_000)}
    huge["nvml"] = [{"file": f"f{i}", "kind": "k"} for i in range(1_000_000)]
    started = time.monotonic()
    got = snapshot_evidence(Snapshot(out, {"evidence": huge}))
    assert time.monotonic() - started < 2
    assert len(got) == EVIDENCE_AREAS_MAX and all(len(refs) == 1 for refs in got.values())


def test_live_captured_and_simulated_audits_have_no_evidence(tmp_path: Path, run_cli: RunCli,
                                                             empty_config: Path) -> None:
    captured = tmp_path / "captured"
    result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(captured))
    assert result.code == 0, result.stderr
    for args in (("--snapshot", str(captured)), ("--simulate", "hgx-h100-healthy"),
                 ("--config", str(empty_config))):  # the last: a live audit of this machine
        report = _audit(run_cli, *args)
        assert report["findings"] and not any("evidence" in f for f in report["findings"])


def test_sos_report_files_are_sections(tmp_path: Path, run_cli: RunCli) -> None:
    tree = F / "sosreport" / "sosreport-gpu-node-07-2024-11-05-qxbzkta"
    out = tmp_path / "snap"
    _import(run_cli, out, tree)
    report = _audit(run_cli, "--snapshot", str(out))
    assert _evidence(report, "gpu.xid") == [{"file": f"{tree}/sos_commands/kernel/dmesg", "kind": "sosreport",
                                             "section": "sos_commands/kernel/dmesg"}]
    assert {"file": f"{tree}/proc/sys/vm/swappiness", "kind": "sosreport",
            "section": "proc/sys/vm/swappiness"} in _evidence(report, "host.sysctl")
