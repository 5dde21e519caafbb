"""`snapshot capture --out FILE.tar.gz [--redact ...]` and `audit --snapshot FILE.tar.gz` (issue 15, 4)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from agent.sources.snapshot import simulated_path
from tests.conftest import RunCli

REDACT = "serials,uuids,hostnames,macs,ips,guids"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_MAC = re.compile(r"(?<![0-9a-f:])(?:[0-9a-f]{2}:){5}[0-9a-f]{2}(?![0-9a-f:])", re.I)
_GUID4 = re.compile(r"(?<![0-9a-f:])(?:[0-9a-f]{4}:){3}[0-9a-f]{4}(?![0-9a-f:])", re.I)


def _originals(root: Path) -> set[str]:
    """Every serial, UUID, MAC and hostname in the simulated node's own files."""
    found: set[str] = set()
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text("utf-8", "replace")
        found |= {u.lower() for u in _UUID.findall(text) if u.strip("0-")}
        found |= {m.lower() for m in _MAC.findall(text) if m.strip("0:")}
        found |= {g.lower() for g in _GUID4.findall(text) if g.strip("0:")}  # sysfs node_guid / sys_image_guid
        if "serial" in path.name and path.read_text().strip() not in ("", "0"):
            found.add(path.read_text().strip())
        if path.suffix == ".json":
            found |= set(re.findall(r'"[A-Za-z_]*[Ss]erial[A-Za-z_]*": "([^"]{4,})"', text))
    found.add("hgx-h100-drifted")
    return found


def test_a_redacted_archive_holds_no_original_identifier_and_audits_the_same(
        run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    out = tmp_path / "x.tar.gz"
    result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out), "--redact", REDACT)
    assert result.code == 0, result.stderr
    originals = _originals(simulated_path("hgx-h100-drifted"))
    assert len(originals) > 5
    with tarfile.open(out) as archive:
        members = archive.getmembers()
        assert all(m.isfile() or m.isdir() for m in members)
        blob = b"\n".join(archive.extractfile(m).read() for m in members if m.isfile())  # type: ignore[union-attr]
    text = blob.decode("utf-8", "replace").lower()
    assert [v for v in originals if v.lower() in text] == []
    report = run_cli("audit", "--snapshot", str(out), "--config", str(empty_config), "--format", "json")
    assert "Traceback" not in report.stderr and report.code in (0, 1), report.stderr
    dumped = report.stdout.lower()
    assert [v for v in originals if v.lower() in dumped] == []
    plain = run_cli("audit", "--simulate", "hgx-h100-drifted", "--config", str(empty_config), "--format", "json")
    assert report.json()["summary"] == plain.json()["summary"]  # the same serial maps to the same token


def test_an_archive_capture_refuses_to_overwrite_and_redact_needs_an_archive(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "x.tar.gz"
    out.write_bytes(b"keep")
    result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out))
    assert result.code == 2 and out.read_bytes() == b"keep"
    assert run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(tmp_path / "d"),
                   "--redact", "serials").code == 2
    assert [p.name for p in tmp_path.iterdir()] == ["x.tar.gz"]


def test_audit_reads_an_unredacted_archive_like_the_folder(run_cli: RunCli, tmp_path: Path,
                                                           empty_config: Path) -> None:
    out = tmp_path / "node.tar.gz"
    assert run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out)).code == 0
    report = json.loads(run_cli("audit", "--snapshot", str(out), "--config", str(empty_config),
                                "--format", "json").stdout)
    plain = run_cli("audit", "--simulate", "hgx-h100-drifted", "--config", str(empty_config), "--format", "json")
    assert report["summary"] == plain.json()["summary"]


def test_redaction_covers_ipv6_infiniband_ids_and_file_names(tmp_path: Path) -> None:
    """What a customer's own files hold beyond the simulated node: IPv6, ibstat GUIDs, port GIDs, and
    identifiers in names (a Redfish tree names resources by serial)."""
    from agent.sources.importers.archive import redact_tree

    root = tmp_path / "snap"
    (root / "fs/sys/class/infiniband/mlx5_0/ports/1/gids").mkdir(parents=True)
    (root / "fs/sys/class/infiniband/mlx5_0/ports/1/gids/0").write_text("fe80:0000:0000:0000:a088:c203:00b8:a50c\n")
    (root / "fs/sys/class/infiniband/mlx5_0/node_guid").write_text("a088:c203:00b8:a50c\n")
    (root / "fs/sys/class/dmi/id").mkdir(parents=True)
    (root / "fs/sys/class/dmi/id/product_serial").write_text("J9X4K7C\n")
    chassis = root / "redfish/v1/Chassis/J9X4K7C"
    chassis.mkdir(parents=True)
    (chassis / "index.json").write_text(json.dumps({"@odata.id": "/redfish/v1/Chassis/J9X4K7C", "SerialNumber": "J9X4K7C"}))
    (root / "ibstat.txt").write_text("Node GUID: 0xa088c20300b8a50c\nPort GUID: 0xa088c20300b8a50c\n"
                                     "inet6 2001:4860:4860::8888/64 and fe80::a288:c2ff:feb8:a50c/64 but ::1 stays\n"
                                     "std::vector and 12:34:56 and 0000:19:00.0 stay\n")
    redact_tree(root, ("serials", "ips", "guids"))
    names = [p.relative_to(root).as_posix() for p in root.rglob("*")]
    blob = "\n".join([*names, *(p.read_text() for p in root.rglob("*") if p.is_file())]).lower()
    for original in ("j9x4k7c", "a088:c203:00b8:a50c", "a088c20300b8a50c", "2001:4860", "fe80::a288"):
        assert original not in blob, original
    assert "::1 stays" in blob and "std::vector and 12:34:56 and 0000:19:00.0 stay" in blob
    moved = [n for n in names if n.startswith("redfish/v1/Chassis/") and n.endswith("index.json")]
    assert len(moved) == 1
    body = json.loads((root / moved[0]).read_text())
    assert body["@odata.id"] == "/" + moved[0].removesuffix("/index.json")  # the folder and its id agree
    gid = (root / "fs/sys/class/infiniband/mlx5_0/ports/1/gids/0").read_text().strip()
    assert re.fullmatch(r"(?:[0-9a-f]{4}:){7}[0-9a-f]{4}", gid), gid  # still a GID in form
