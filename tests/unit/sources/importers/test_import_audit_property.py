"""Issue 31.1: whatever `snapshot import` writes, `audit --snapshot` reads. A limit bounds hostile input,
never the product's own output: the per-input index (one row per file of a 3,000-resource Redfish tree or a
big sysfs tree) lives in its own bounded inputs.jsonl, not in meta.yaml (which stays a few KB), and an old
snapshot with `inputs` inside meta.yaml still reads. Everything goes through the real click CLI."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from agent.sources.snapshot import INDEX_FILE, INDEX_LINE_MAX_BYTES, META_MAX_BYTES, index_max_bytes
from tests.conftest import REPO, RunCli


def _audit(run_cli: RunCli, snapshot: Path, config: Path) -> tuple[int, str, str]:
    result = run_cli("audit", "--snapshot", str(snapshot), "--config", str(config), "--format", "json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.code, result.stdout, result.stderr


def _imported_then_audited(run_cli: RunCli, out: Path, config: Path, *inputs: Path) -> dict[str, object] | None:
    """None when import refuses the inputs; else the audit's JSON report (audit must never refuse it)."""
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert "Traceback" not in result.stderr, result.stderr
    if result.code != 0:
        return None
    code, stdout, stderr = _audit(run_cli, out, config)
    assert code != 2, f"audit refused what import wrote from {inputs}: {stderr}"
    assert (out / "meta.yaml").stat().st_size <= META_MAX_BYTES // 2  # the index is in its own file
    return json.loads(stdout)  # type: ignore[no-any-return]


def _fixture_inputs() -> list[tuple[Path, str]]:
    """Every capture in fixtures/ an operator could hand to `snapshot import` (a group of single-file captures as
    its folder), each as given and the trees also as the archive a customer sends."""
    base = REPO / "fixtures"
    found = [(base / group, "folder") for group in ("import-samples", "kmsg", "kernel-events", "fabric",
                                                      "nvidia-smi", "real/linux", "real/ipmi")]
    trees = [*sorted((base / "redfish").iterdir()), *sorted((base / "real" / "redfish").iterdir()),
             *sorted((base / "redfish-chassis-drives").iterdir()), *sorted((base / "sosreport").iterdir())]
    found += [(tree, "folder") for tree in trees if tree.is_dir()]
    found += [(base / "sosreport" / name, form) for name in sorted(os.listdir(base / "sosreport"))
              for form in ("tar.xz", "zip")]
    found += [(base / "redfish" / "hpe-dl380a-gen11", "tar.gz")]
    return found


def _given(source: Path, form: str, tmp_path: Path) -> Path:
    if form == "folder":
        return source
    if form == "zip":
        return Path(shutil.make_archive(str(tmp_path / source.name), "zip", source.parent, source.name))
    path = tmp_path / f"{source.name}.{form}"
    with tarfile.open(path, "w:xz" if form == "tar.xz" else "w:gz") as archive:
        archive.add(source, arcname=source.name)
    return path


_FIXTURE_INPUTS = _fixture_inputs()


@pytest.mark.parametrize(("source", "form"), _FIXTURE_INPUTS,
                         ids=[f"{p.relative_to(REPO / 'fixtures')}-{f}" for p, f in _FIXTURE_INPUTS])
def test_import_then_audit_never_refuses_a_fixture(source: Path, form: str, tmp_path: Path, run_cli: RunCli,
                                                   empty_config: Path) -> None:
    report = _imported_then_audited(run_cli, tmp_path / "snap", empty_config, _given(source, form, tmp_path))
    if report is not None:  # most are accepted (asserted below); what import refuses has nothing to audit
        assert isinstance(report["findings"], list)
        assert (tmp_path / "snap" / INDEX_FILE).is_file()
        _ACCEPTED.append(source)


_ACCEPTED: list[Path] = []


def test_the_property_was_not_vacuous() -> None:
    """Runs after the parametrized test (file order): most fixture captures import, so most were audited."""
    assert len(_ACCEPTED) >= len(_FIXTURE_INPUTS) * 3 // 4, _ACCEPTED


def _big_redfish(root: Path, resources: int) -> Path:
    """A Redfish-Mockup-Creator tree as big as a current BMC's, with long sensor paths."""
    tree = root / "idrac9-full"
    base = tree / "redfish" / "v1"
    members = []
    per = resources - 3
    for i in range(per):
        rel = f"Chassis/System.Embedded.1/Sensors/iDRAC.Embedded.1_SystemBoard_{'Long' * 12}_Sensor_{i:05d}"
        members.append({"@odata.id": f"/redfish/v1/{rel}"})
        body = {"@odata.id": f"/redfish/v1/{rel}", "@odata.type": "#Sensor.v1_5_0.Sensor", "Id": f"s{i}",
                "Name": f"Sensor {i}", "Reading": 20.0, "ReadingType": "Temperature", "Status": {"Health": "OK"}}
        (base / rel).mkdir(parents=True)
        (base / rel / "index.json").write_text(json.dumps(body))
    sensors = base / "Chassis/System.Embedded.1/Sensors"
    (sensors / "index.json").write_text(json.dumps({
        "@odata.id": "/redfish/v1/Chassis/System.Embedded.1/Sensors", "Members": members,
        "Members@odata.count": len(members)}))
    (base / "Chassis/System.Embedded.1/index.json").write_text(json.dumps({
        "@odata.id": "/redfish/v1/Chassis/System.Embedded.1", "Id": "System.Embedded.1",
        "Sensors": {"@odata.id": "/redfish/v1/Chassis/System.Embedded.1/Sensors"}, "Status": {"Health": "OK"}}))
    (base / "index.json").write_text(json.dumps({"@odata.id": "/redfish/v1", "RedfishVersion": "1.17.0"}))
    return tree


def _big_sysfs(root: Path, files: int) -> Path:
    """A big server's sysfs tree as a tar.gz: deep PCI and cpu paths, one small file each."""
    tree = root / "sysfs"
    for i in range(files):
        cpu, attr = divmod(i, 12)
        if i % 2:
            rel = f"sys/devices/system/cpu/cpu{cpu}/cpufreq/attr_{'x' * 40}_{attr}"
        else:
            rel = (f"sys/devices/pci0000:{cpu % 256:02x}/0000:{cpu % 256:02x}:01.0/0000:{cpu % 256:02x}:00.{attr % 8}"
                   f"/power/attr_{'y' * 40}_{i}")
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("1\n")
    archive = root / "sysfs.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as out:
        out.add(tree / "sys", arcname="sys")
    return archive


def test_a_full_bmc_tree_and_a_big_sysfs_tree_import_then_audit(tmp_path: Path, run_cli: RunCli,
                                                                empty_config: Path) -> None:
    redfish = _big_redfish(tmp_path, 3500)
    sysfs = _big_sysfs(tmp_path, 3000)
    for name, given in (("redfish", redfish), ("sysfs", sysfs)):
        out = tmp_path / f"snap-{name}"
        report = _imported_then_audited(run_cli, out, empty_config, given)
        assert report is not None, f"import refused the {name} tree"
        rows = (out / INDEX_FILE).read_text().splitlines()
        assert len(rows) >= 3000  # one row per input, none lost
        assert all(len(row.encode()) <= INDEX_LINE_MAX_BYTES for row in rows)
        inputs = report["node"]["snapshot"]["inputs"]  # type: ignore[index]
        assert len(inputs) == 1000 and all(item["name"] for item in inputs)  # the report's own bound
    # `snapshot capture` of the imported snapshot (a copy, redacted into an archive) keeps the index beside
    # meta.yaml, and the archive audits too.
    archive = tmp_path / "sent.tar.gz"
    result = run_cli("snapshot", "capture", "--snapshot", str(tmp_path / "snap-sysfs"), "--out", str(archive),
                     "--redact", "hostnames,serials")
    assert result.code == 0, result.stderr
    with tarfile.open(archive) as sent:
        assert any(name.endswith("/" + INDEX_FILE) for name in sent.getnames())
    code, _stdout, stderr = _audit(run_cli, archive, empty_config)
    assert code != 2, stderr


def _old_style(snapshot: Path, meta: Mapping[str, object]) -> None:
    snapshot.mkdir()
    (snapshot / "fs").mkdir()
    (snapshot / "fs" / "proc").mkdir()
    (snapshot / "fs" / "proc" / "cmdline").write_text("ro quiet\n")
    (snapshot / "meta.yaml").write_text(yaml.safe_dump(dict(meta)))


def test_an_old_snapshot_with_its_index_in_meta_yaml_still_reads(tmp_path: Path, run_cli: RunCli,
                                                                 empty_config: Path) -> None:
    meta = {"hostname": "old", "captured_at": "2026-01-01T00:00:00+00:00", "nodewarden_version": "0.1",
            "captured": ["host"], "source": "snapshot import of 1 input(s)",
            "inputs": [{"name": "cmdline.txt", "size": 9, "sha256": "0" * 64, "kind": "sosreport",
                        "contributed": ["host"]}], "fed_by": {"host": ["cmdline.txt"]}}
    _old_style(tmp_path / "old", meta)
    code, stdout, stderr = _audit(run_cli, tmp_path / "old", empty_config)
    assert code != 2, stderr
    assert [i["name"] for i in json.loads(stdout)["node"]["snapshot"]["inputs"]] == ["cmdline.txt"]
    big = {**meta, "inputs": [{"name": f"{i}" + "x" * 1000, "kind": "k"} for i in range(1200)]}  # an old meta.yaml past its old bound
    _old_style(tmp_path / "old-big", big)
    assert (tmp_path / "old-big" / "meta.yaml").stat().st_size > META_MAX_BYTES
    code, _stdout, stderr = _audit(run_cli, tmp_path / "old-big", empty_config)
    assert code == 2 and "meta.yaml" in stderr and "larger than" in stderr


def test_a_hostile_index_is_refused_by_name(tmp_path: Path, run_cli: RunCli, empty_config: Path) -> None:
    meta = {"hostname": "h", "captured_at": "2026-01-01T00:00:00+00:00", "nodewarden_version": "0.1",
            "captured": ["host"], "source": "snapshot import of 1 input(s)"}
    header = json.dumps({"format": "nodewarden.inputs/v1", "entries": 1})
    for name, body in (("long-row", header + "\n" + json.dumps({"name": "x" * INDEX_LINE_MAX_BYTES}) + "\n"),
                       ("not-json", header + "\n{not json\n"),
                       ("no-header", json.dumps({"name": "a"}) + "\n")):
        snap = tmp_path / name
        _old_style(snap, meta)
        (snap / INDEX_FILE).write_text(body)
        code, _stdout, stderr = _audit(run_cli, snap, empty_config)
        assert code == 2 and INDEX_FILE in stderr, (name, stderr)
    snap = tmp_path / "huge"
    _old_style(snap, meta)
    with open(snap / INDEX_FILE, "wb") as handle:  # sparse: its size past the bound, no disk spent
        handle.write(header.encode() + b"\n")
        handle.truncate(index_max_bytes() + 1)
    code, _stdout, stderr = _audit(run_cli, snap, empty_config)
    assert code == 2 and INDEX_FILE in stderr and "larger than" in stderr, stderr
    snap = tmp_path / "link"
    _old_style(snap, meta)
    (snap / INDEX_FILE).symlink_to("/etc/passwd")
    code, _stdout, stderr = _audit(run_cli, snap, empty_config)
    assert code == 2 and "symlink" in stderr, stderr


def test_a_huge_sel_imports_into_an_ipmi_json_audit_reads(tmp_path: Path, run_cli: RunCli, empty_config: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """ipmitool accepts 64 MiB and 100,000 SEL lines; ipmi.json once grew past the 32 MiB audit reads. Scaled
    down here (audit reading 2 MiB) to stay fast: the writer keeps the newest entries that fit, and says so."""
    from agent.sources import bmc_source
    from agent.sources.importers import ipmitool

    assert ipmitool.SEL_BUDGET + ipmitool.SENSORS_BUDGET + (4 << 20) <= bmc_source.RECORDING_MAX_BYTES
    monkeypatch.setattr(bmc_source, "RECORDING_MAX_BYTES", 2 << 20)
    monkeypatch.setattr(ipmitool, "SEL_BUDGET", 1 << 20, raising=False)
    sel = tmp_path / "sel.txt"
    sel.write_text("".join(f"{i:4x} | 11/05/2024 | 10:00:00 | Memory #0x53 | Correctable ECC {'x' * 500} | Asserted\n"
                           for i in range(1, 5001)))
    report = _imported_then_audited(run_cli, tmp_path / "snap", empty_config, sel)
    assert report is not None
    kept = json.loads((tmp_path / "snap" / "ipmi.json").read_text())["sel"]
    assert kept[-1]["record_id"] == 5000 and len(kept) < 5000  # the newest are kept
    row = json.loads((tmp_path / "snap" / INDEX_FILE).read_text().splitlines()[1])
    assert any("older SEL entries" in text for text in row["skipped"])


def test_links_stop_at_what_fs_links_json_may_hold(tmp_path: Path, run_cli: RunCli, empty_config: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 members with 4 KB link targets could make an fs_links.json past the 64 MiB audit reads; scaled
    down (a 4 KiB budget): the links past it are named as not recorded, and the snapshot audits."""
    from agent.sources.importers import base

    monkeypatch.setattr(base, "LINKS_BUDGET", 4 << 10, raising=False)
    tree = tmp_path / "sysfs"
    (tree / "sys/devices/virtual/net").mkdir(parents=True)
    (tree / "sys/class/net").mkdir(parents=True)
    for i in range(200):
        (tree / f"sys/devices/virtual/net/eth{i}").mkdir()
        (tree / f"sys/devices/virtual/net/eth{i}/mtu").write_text("1500\n")
        (tree / f"sys/class/net/eth{i}").symlink_to(f"../../devices/virtual/net/eth{i}")
    archive = tmp_path / "sysfs.tar.gz"
    with tarfile.open(archive, "w:gz") as out:
        out.add(tree / "sys", arcname="sys")
    report = _imported_then_audited(run_cli, tmp_path / "snap", empty_config, archive)
    assert report is not None
    assert (tmp_path / "snap" / "fs_links.json").stat().st_size <= 5 << 10
    index = (tmp_path / "snap" / INDEX_FILE).read_text()
    assert "fs_links.json holds at most" in index


def test_nvml_and_redfish_parts_past_what_audit_reads_are_not_recorded(
        tmp_path: Path, run_cli: RunCli, empty_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's bound is the writer's: with both scaled down (nvml.json to 2 KiB, a Redfish resource to
    16 KiB), an import whose NVML recording or one resource is larger names it as not recorded, and audit
    reads the rest (it refused the whole snapshot when the writer did not know the reader's bound)."""
    from agent.sources import nvml_replay, redfish_client
    from agent.sources.importers import base

    for module, name, size in ((base, "NVML_MAX_BYTES", 2 << 10), (nvml_replay, "RECORDING_MAX_BYTES", 2 << 10),
                               (base, "REDFISH_MAX_BYTES", 16 << 10),
                               (redfish_client, "RECORDED_RESOURCE_MAX_BYTES", 16 << 10)):
        monkeypatch.setattr(module, name, size, raising=False)
    smi = REPO / "fixtures/nvidia-smi/gpud/nvidia-smi-query.535.161.08.out.0.valid.txt"
    alone = run_cli("snapshot", "import", str(smi), "--out", str(tmp_path / "alone"))
    assert alone.code == 2 and "nothing of the inputs could be recorded" in alone.stderr, alone.stderr
    assert "audit reads of nvml.json; not recorded" in alone.stderr
    kmsg = next(p for p in sorted((REPO / "fixtures" / "kmsg").iterdir()) if p.is_file() and p.suffix != ".md")
    report = _imported_then_audited(run_cli, tmp_path / "nvml", empty_config, smi, kmsg)
    assert report is not None and not (tmp_path / "nvml" / "nvml.json").exists()
    assert "audit reads of nvml.json; not recorded" in (tmp_path / "nvml" / INDEX_FILE).read_text()
    tree = REPO / "fixtures/redfish/supermicro-x10"
    big = tree / "redfish/v1/Systems/1/LogServices/Log1/Entries/index.json"
    assert big.stat().st_size > 16 << 10
    report = _imported_then_audited(run_cli, tmp_path / "rf", empty_config, tree)
    assert report is not None
    assert not (tmp_path / "rf" / big.relative_to(tree)).exists()
    assert (tmp_path / "rf" / "redfish/v1/Systems/1/index.json").exists()
    assert "audit reads of one resource; not recorded" in (tmp_path / "rf" / INDEX_FILE).read_text()
