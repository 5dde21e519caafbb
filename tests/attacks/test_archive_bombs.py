"""Hostile archives and link maps: every bound holds before memory or time is spent (issue 21 item 8).

The memory cases run the Reader in a child whose address space is capped (RLIMIT_AS, 300 MB);
the archives are generated streaming, so the test itself stays small.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import struct
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

MEMORY_CAP = 300 << 20

_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
from pathlib import Path
from agent.sources.importers.inputs import Reader
entries = []
for entry in Reader().read_paths([Path(sys.argv[1])]):
    entries.append(entry)  # an archive's error lands on its entry after its members were read
    if len(entries) > 50:
        break
print(json.dumps([{{"name": e.name, "error": e.error}} for e in entries]))
"""


def _read_capped(path: Path) -> list[dict[str, str | None]]:
    done = subprocess.run([sys.executable, "-c", _CHILD.format(cap=MEMORY_CAP), str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: list[dict[str, str | None]] = json.loads(done.stdout)
    return result


def _million_entry_zip(path: Path, entries: int = 1_000_000) -> None:
    """A zip64 archive of `entries` directory entries (the shape zipfile writes), ~54 MB, built by hand."""
    first = b"d0000000/"
    local = struct.pack("<4sHHHHHLLLHH", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(first), 0) + first
    with path.open("wb") as out:
        out.write(local)
        cd_start = len(local)
        cd_size = 0
        batch: list[bytes] = []
        for i in range(entries):
            name = b"d%07d/" % i
            batch.append(struct.pack("<4sHHHHHHLLLHHHHHLL", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0,
                                     len(name), 0, 0, 0, 0, 0o40755 << 16, 0) + name)
            if len(batch) == 10_000:
                chunk = b"".join(batch)
                out.write(chunk)
                cd_size += len(chunk)
                batch = []
        chunk = b"".join(batch)
        out.write(chunk)
        cd_size += len(chunk)
        zip64_at = cd_start + cd_size
        out.write(struct.pack("<4sQHHLLQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, cd_size, cd_start))
        out.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, zip64_at, 1))
        out.write(struct.pack("<4sHHHHLLH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


def test_a_million_entry_zip_is_refused_within_300_mb(tmp_path: Path) -> None:
    bomb = tmp_path / "bundle.zip"
    _million_entry_zip(bomb)
    entries = _read_capped(bomb)
    assert entries[0]["name"] == str(bomb)
    assert "1000000 members declared" in (entries[0]["error"] or "")
    assert len(entries) == 1  # nothing was listed, let alone read


def test_a_zip_whose_end_record_understates_its_entries_is_still_counted(tmp_path: Path) -> None:
    """No zip64 record: the 16-bit count says 16,960 (1M mod 65536), zipfile would list all 1M by the
    directory's size. The walk of the directory counts them, stopping one past the cap."""
    bomb = tmp_path / "liar.zip"
    _million_entry_zip(bomb)
    data = bytearray(bomb.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    cd_start = data.find(b"PK\x01\x02")
    cd_size = end - 76 - cd_start
    del data[end - 76:]  # the zip64 record and locator go; a short end record replaces the zip64 one
    data += struct.pack("<4sHHHHLLH", b"PK\x05\x06", 0, 0, 1_000_000 % 65536, 1_000_000 % 65536, cd_size, cd_start, 0)
    bomb.write_bytes(bytes(data))
    del data
    entries = _read_capped(bomb)
    assert "more than 100000 members" in (entries[0]["error"] or "")
    assert len(entries) == 1


def _pax_bomb(path: Path, header_bytes: int = 200 << 20) -> None:
    """A tar.gz whose first member carries a 200 MB PAX header (compressed: a few hundred KB)."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = header_bytes
    meta = tarfile.TarInfo("snap/meta.yaml")
    body = b"hostname: n1\n"
    meta.size = len(body)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(pax.tobuf(format=tarfile.USTAR_FORMAT))
        record = b"%d comment=" % header_bytes
        out.write(record)
        left = header_bytes - len(record)
        block = b"a" * (1 << 20)
        while left > 0:
            out.write(block[:min(left, len(block))] if left > 1 else b"\n")
            left -= min(left, len(block))
        out.write(b"\0" * (-header_bytes % 512))
        out.write(meta.tobuf(format=tarfile.USTAR_FORMAT))
        out.write(body + b"\0" * (-len(body) % 512))
        out.write(b"\0" * 1024)


def test_a_200_mb_pax_header_is_refused_within_300_mb(tmp_path: Path) -> None:
    bomb = tmp_path / "snap.tar.gz"
    _pax_bomb(bomb)
    assert bomb.stat().st_size < 2 << 20
    entries = _read_capped(bomb)
    assert entries[0]["name"] == str(bomb)
    assert "extended (PAX or long-name) header of 200 MiB" in (entries[0]["error"] or "")
    assert [e["name"] for e in entries[1:]] == []  # the member behind it is not imported


def test_a_long_run_of_small_pax_headers_is_refused(tmp_path: Path) -> None:
    """Thousands of small extended headers in a row: tarfile follows them by recursion."""
    bomb = tmp_path / "run.tar"
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    record = b"16 comment=aaaa\n"
    pax.size = len(record)
    one = pax.tobuf(format=tarfile.USTAR_FORMAT) + record + b"\0" * (512 - len(record))
    meta = tarfile.TarInfo("meta.yaml")
    bomb.write_bytes(one * 5000 + meta.tobuf(format=tarfile.USTAR_FORMAT) + b"\0" * 1024)
    entries = _read_capped(bomb)
    assert "extended headers in a row" in (entries[0]["error"] or "")
    # Long names (GNU `L`) and PAX records of a real size still pass.
    path = tmp_path / "ok.tar.gz"
    long_name = "sys/" + "d" * 200 + "/value"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo(long_name)
        info.size = 3
        info.pax_headers = {"comment": "x" * 5000}
        archive.addfile(info, fileobj=io.BytesIO(b"abc"))
    entries = _read_capped(path)
    assert entries[0]["error"] is None
    assert (entries[1]["name"], entries[1]["error"]) == (f"{path}:{long_name}", None)


def test_a_200k_link_chain_stays_bounded_in_time(tmp_path: Path) -> None:
    """200k chained links in fs_links.json, listed under sys/class/net, four files read under each
    (what an audit does): bounded (was 20 s of CPU here, 139 s for the audit), and resolution still exact."""
    count = 200_000
    from agent.sources.fsroot_snapshot import SnapshotFs

    snap = tmp_path / "snap"
    (snap / "fs" / "sys" / "class" / "net").mkdir(parents=True)
    links = {f"sys/class/net/l{i}": f"l{i + 1}" for i in range(count)}
    (snap / "fs_links.json").write_text(json.dumps(links))
    fs = SnapshotFs(snap)
    started = time.process_time()
    names = fs.listdir("/sys/class/net")
    for name in names:
        for leaf in ("mtu", "operstate", "address", "speed"):
            with contextlib.suppress(OSError):
                fs.read_bytes(f"/sys/class/net/{name}/{leaf}")
    elapsed = time.process_time() - started
    assert len(names) == count
    assert elapsed < 8, f"{elapsed:.1f} s of CPU"
    # Remembering never changes an answer: 40 hops resolve, 41 are a loop, in either order.
    short = tmp_path / "short"
    (short / "fs").mkdir(parents=True)
    (short / "fs_links.json").write_text(json.dumps({f"c{i}": f"c{i + 1}" for i in range(45)}))
    fs = SnapshotFs(short)
    with pytest.raises(OSError, match="Too many levels"):
        fs.resolve("/c4")
    assert fs.resolve("/c5") == "c45"
    assert fs.resolve("/c44/x") == "c45/x"
    with pytest.raises(OSError, match="Too many levels"):
        fs.resolve("/c0/x")
    assert fs.resolve("/c6") == "c45"


def _audit(snapshot: Path, config: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "agent", "audit", "--snapshot", str(snapshot), "--config",
                           str(config), "--format", "json"], capture_output=True, text=True, timeout=20,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_a_200k_link_listing_is_cut_and_said_so(drifted_copy: Path, empty_config: Path) -> None:
    """The same 200k chained links in a whole snapshot's sys/class/net, and 5,000 PCI functions: the
    audit ends well within 20 s (was 139 s, then ~8 s of ~8 reads per listed name), the listings past
    the cap become `unknown` naming what was cut, and no failure appears that the node did not have."""
    clean = _audit(drifted_copy, empty_config)
    links_file = drifted_copy / "fs_links.json"
    links = json.loads(links_file.read_text())
    links.update({f"sys/class/net/l{i}": f"l{i + 1}" for i in range(200_000)})
    links.update({f"sys/bus/pci/devices/0000:{i >> 8:02x}:{i & 0xff:02x}.0": "../../../devices/x"
                  for i in range(5_000)})
    links_file.unlink()  # a hard link shared with the session's copy: replace, never write through
    links_file.write_text(json.dumps(links))
    hostile = _audit(drifted_copy, empty_config)
    by_check = {(f["check"], f["subject"]): f for f in hostile["findings"]}
    mtu = by_check[("net.mtu", "node")]
    assert mtu["status"] == "unknown"
    assert "/sys/class/net lists 200,01" in mtu["message"] and "more than the 4,096" in mtu["message"]
    assert any("/sys/bus/pci/devices lists 5,5" in f["message"] and f["status"] == "unknown"
               for f in hostile["findings"]), [f["message"] for f in hostile["findings"] if f["status"] == "unknown"]
    # Failures per check (a GPU is named by its PCI address once PCI is unknown: the same Xid 79).
    failed = Counter(f["check"] for f in clean["findings"] if f["status"] == "fail")
    assert Counter(f["check"] for f in hostile["findings"] if f["status"] == "fail") <= failed
