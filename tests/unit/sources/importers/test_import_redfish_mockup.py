"""`snapshot import` of a Redfish mockup (issue 15): a real DMTF Redfish-Mockup-Creator tree from fixtures/redfish/
(see its SOURCES.md), as a folder and as a .tar.gz, audits exactly as the BMC-only snapshot of the same tree
(the layout a recorded BMC read stores, as tests/oracle/test_corpus.py builds it); hostile paths, @odata.ids, deep JSON and
links are refused by name and the rest imports."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, RunCli

TREES = [REPO / "fixtures" / "redfish" / name for name in ("hpe-dl380a-gen11", "gathergpus_happypath")]
FLAT = REPO / "fixtures" / "real" / "redfish" / "lambdalabs-exporter-fixtures" / "hack-sampleOut"


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> tuple[dict[str, Any], str, str]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text()), result.stdout, result.stderr


def _bmc_findings(run_cli: RunCli, snapshot: Path, config: Path) -> list[tuple[str, str, str, str]]:
    result = run_cli("audit", "--snapshot", str(snapshot), "--config", str(config), "--format", "json")
    assert result.code in (0, 1) and "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    return sorted((f["check"], f["subject"], f["status"], f.get("reason") or f.get("message") or "")
                  for f in report["findings"] if f["check"].startswith("bmc."))


def _bmc_only(tree: Path, snapshot: Path) -> None:
    """The tree as a recorded BMC read stores it (tests/oracle/test_corpus.py `_redfish_snapshot`, no omitted paths)."""
    shutil.copytree(tree / "redfish", snapshot / "redfish")
    (snapshot / "meta.yaml").write_text("hostname: corpus\ncaptured_at: '2024-06-01T00:00:00+00:00'\n"
                                        "nodewarden_version: corpus\ncaptured: [redfish]\n", encoding="utf-8")


def _targz(tree: Path, path: Path) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        archive.add(tree / "redfish", arcname=f"{tree.name}/redfish")
    return path


@pytest.mark.parametrize("tree", TREES, ids=lambda p: p.name)
def test_a_real_mockup_audits_as_the_bmc_only_snapshot(tree: Path, tmp_path: Path, run_cli: RunCli,
                                                       empty_config: Path) -> None:
    _bmc_only(tree, tmp_path / "recorded")
    expected = _bmc_findings(run_cli, tmp_path / "recorded", empty_config)
    assert expected and any(status != "skip" for _c, _s, status, _r in expected)
    for name, given in (("folder", tree), ("targz", _targz(tree, tmp_path / "mockup.tar.gz"))):
        out = tmp_path / name
        meta, stdout, _err = _import(run_cli, out, given)
        assert meta["captured"] == ["redfish"]
        files = sorted(p.relative_to(tree).as_posix() for p in (tree / "redfish").rglob("index.json"))
        assert sorted(p.relative_to(out).as_posix() for p in (out / "redfish").rglob("index.json")) == files
        assert {e["kind"] for e in meta["inputs"] if e["name"].endswith("index.json")} == {"redfish-mockup"}
        assert f"redfish-mockup: {len(files):,} files, {len(files):,} used (redfish {len(files):,})\n" in stdout
        assert _bmc_findings(run_cli, out, empty_config) == expected, name


def test_resources_named_by_their_odata_id_land_where_it_says(tmp_path: Path, run_cli: RunCli) -> None:
    meta, _out, _err = _import(run_cli, tmp_path / "snap", FLAT)
    system = json.loads((FLAT / "system.json").read_text())
    stored = tmp_path / "snap" / system["@odata.id"].strip("/") / "index.json"
    assert json.loads(stored.read_text()) == system
    assert any(e["kind"] == "redfish-mockup" and e["contributed"] for e in meta["inputs"])


def _member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def test_hostile_members_are_refused_by_name_and_the_rest_imports(tmp_path: Path, run_cli: RunCli) -> None:
    tree = TREES[1]
    path = tmp_path / "hostile.tar.gz"
    root = {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot", "Id": "RootService"}
    with tarfile.open(path, "w:gz") as archive:
        archive.add(tree / "redfish", arcname="m/redfish")
        _member(archive, "m/redfish/v1/Systems/%2e%2e/%2e%2e/%2e%2e/etc/index.json", json.dumps(root).encode())
        _member(archive, "m/redfish/v1/Chassis/Evil/index.json",
                json.dumps({"@odata.id": "/etc/passwd", "Id": "x"}).encode())
        _member(archive, "m/loose.json", json.dumps({"@odata.id": "/redfish/v1/../../etc", "Id": "y"}).encode())
        _member(archive, "m/redfish/v1/Deep/index.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
        link = tarfile.TarInfo("m/redfish/v1/Managers/index.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        archive.addfile(link)
    meta, _out, err = _import(run_cli, tmp_path / "snap", path)
    errors = {e["name"].split(":", 1)[1]: e["error"] for e in meta["inputs"] if e.get("error")}
    assert set(errors) == {"m/redfish/v1/Systems/%2e%2e/%2e%2e/%2e%2e/etc/index.json",
                           "m/redfish/v1/Chassis/Evil/index.json", "m/loose.json", "m/redfish/v1/Deep/index.json",
                           "m/redfish/v1/Managers/index.json"}, errors
    assert "not a Redfish resource path" in errors["m/redfish/v1/Systems/%2e%2e/%2e%2e/%2e%2e/etc/index.json"]
    assert "'/etc/passwd'" in errors["m/redfish/v1/Chassis/Evil/index.json"]
    assert "nested deeper" in errors["m/redfish/v1/Deep/index.json"]
    assert "symlink" in errors["m/redfish/v1/Managers/index.json"]
    for name in errors:
        assert name in err
    stored = sorted(p.relative_to(tmp_path / "snap").as_posix() for p in (tmp_path / "snap").rglob("*")
                    if p.is_file() and p.name not in ("meta.yaml", "inputs.jsonl"))
    assert stored == sorted(p.relative_to(tree).as_posix() for p in (tree / "redfish").rglob("index.json"))


def test_the_import_prints_a_line_per_kind_every_file_with_v_and_only_errors_with_q(
        tmp_path: Path, run_cli: RunCli) -> None:
    """Issue 26.5: a mockup of hundreds of files is one summary line, not one line per file."""
    tree = tmp_path / "in"
    shutil.copytree(TREES[0] / "redfish", tree / "redfish")
    (tree / "junk.bin").write_bytes(b"\x00\x01\x02" * 100)
    (tree / "redfish" / "v1" / "broken.json").write_text('{"@odata.id": 7}')
    files = len(list((tree / "redfish").rglob("index.json")))
    result = run_cli("snapshot", "import", str(tree), "--out", str(tmp_path / "summary"))
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"redfish-mockup: {files:,} files, {files:,} used (redfish {files:,})",
        "1 error, 1 file of no kind nodewarden reads (on stderr; -v lists every file and what it gave)",
        f"imported redfish into {tmp_path / 'summary'}"]
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["error", "skipped"]
    verbose = run_cli("snapshot", "import", "-v", str(tree), "--out", str(tmp_path / "every"))
    assert verbose.code == 0 and len(verbose.stdout.splitlines()) == files + 1
    assert all(" (redfish-mockup): redfish: /redfish/v1" in line for line in verbose.stdout.splitlines()[:-1])
    quiet = run_cli("snapshot", "import", "-q", str(tree), "--out", str(tmp_path / "quiet"))
    assert quiet.code == 0 and quiet.stdout == ""
    assert quiet.stderr.startswith(f"error: {tree / 'redfish' / 'v1' / 'broken.json'}: ") and "junk.bin" not in quiet.stderr


def test_import_help_lists_every_kind(run_cli: RunCli) -> None:
    from agent.sources.importers.bundle import kind_names
    from agent.sources.importers.summary import IMPORT_KINDS

    assert list(IMPORT_KINDS) == kind_names()
    shown = " ".join(run_cli("snapshot", "import", "--help").stdout.split())
    assert all(kind in shown.replace("- ", "-") for kind in kind_names()), shown
    assert "--quiet" in shown and "lists every file" in shown
