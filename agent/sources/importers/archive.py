"""Snapshots as one archive: `snapshot capture --out node.tar.gz [--redact ...]`, `audit --snapshot node.tar.gz`.

Writing: the snapshot is captured into a private (0700) temporary folder beside
the target, redacted there, packed into a temporary .tar.gz in that folder
(created with O_EXCL, regular files and folders only, owner and group names
dropped), then published by one rename (agent.io.fsout.OutputDir.publish: the target
must not exist) and the temporary folder removed.

`--redact serials,uuids,hostnames,macs,ips,guids` replaces each value in every file of
the snapshot, and in the file and folder names of its Redfish tree (resources named by
serial or host name; fs/ names are the kernel's), with a token, the same value always with the same token (so
cross-checks between sources still match): serials (any JSON key or sysfs file
named *serial*), UUIDs (any 8-4-4-4-12 hex), hostnames (meta.yaml's, the recorded
hostname files' and JSON host-name fields', whatever their length, by token: agent.sources.importers.redact_hosts),
MACs (6-octet colon form, and every
sys/class/net/*/address), IPv4 and IPv6 addresses, InfiniBand GUIDs (`0x` and 16
hex digits as ibstat prints them, four colon groups as sysfs node_guid) and GIDs
(eight groups of four: an IPv6 address in form, so `ips` or `guids` redacts it).

Reading: the archive is read with the importer's rules (agent.sources.importers.inputs:
bounded, no links, no absolute names, no "..") and its files written into a
private temporary folder ($TMPDIR/nodewarden-snapshot-PID-*) that is removed when the
process exits, SIGTERM included; one left by a killed run (SIGKILL) is removed by the next
run that extracts an archive, once its pid is gone.

Redaction refuses (exit 2) a JSON file nested too deeply to be searched for serials: an
archive with them left in it is never written.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from agent.core.errors import SnapshotError
from agent.sources.importers.redact_hosts import (
    HOST_FILES,
    HostNames,
    host_forms,
    is_kernel_data,
    json_hosts,
    unsafe_names,
)

T = TypeVar("T")
REDACT_KINDS = ("serials", "uuids", "hostnames", "macs", "ips", "guids")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
_UUID_RE = re.compile(rb"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
                      rb"(?![0-9A-Fa-f])")
_MAC_RE = re.compile(rb"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![0-9A-Fa-f:])")
_IP_RE = re.compile(rb"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\d.])")
_KEEP_IPS = {b"0.0.0.0", b"127.0.0.1", b"255.255.255.255"}
_H4 = rb"[0-9A-Fa-f]{1,4}"
# IPv6: eight groups, or a `::` with a group after it (never a bare `::`, `::1` or C++'s `std::`); not inside a
# longer hex/colon run.
_IP6_RE = re.compile(rb"(?<![0-9A-Fa-f:])(?:(?:" + _H4 + rb":){7}" + _H4 + rb"|(?:" + _H4 + rb":){1,6}:" + _H4
                     + rb"(?::" + _H4 + rb"){0,5}|::(?:" + _H4 + rb":){1,6}" + _H4 + rb")(?![0-9A-Fa-f:])")
_GID_RE = re.compile(rb"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{4}:){7}[0-9A-Fa-f]{4}(?![0-9A-Fa-f:])")
_GUID_RE = re.compile(rb"(?<![0-9A-Za-z])0x[0-9A-Fa-f]{16}(?![0-9A-Za-z])")  # ibstat's Node/Port GUID
_GUID4_RE = re.compile(rb"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{4}:){3}[0-9A-Fa-f]{4}(?![0-9A-Fa-f:])")  # sysfs node_guid
_PLACEHOLDERS = {"", "0", "n/a", "na", "none", "null", "not specified", "to be filled by o.e.m.", "default string",
                 "unknown", "[n/a]", "0123456789", "system serial number"}


def is_archive(path: Path) -> bool:
    return path.name.endswith(ARCHIVE_SUFFIXES)


def parse_redact(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in REDACT_KINDS]
    if bad:
        raise SnapshotError(f"--redact: unknown {bad[0]!r} (choose from {', '.join(REDACT_KINDS)})")
    return kinds


# --- redaction -------------------------------------------------------------------------------------


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _json_serials(value: Any, found: set[str]) -> None:
    pending = [value]  # a stack, not recursion: a hostile BMC's body may nest as deep as it likes
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and "serial" in str(key).lower():
                    found.add(item.strip())
                else:
                    pending.append(item)
        elif isinstance(value, list):
            pending.extend(value)


def _json_for_redaction(path: Path, rel: str) -> Any:
    """A snapshot file's JSON, or None when it is not JSON. Too deep to parse is refused: its serials
    could not be found, and the archive would carry them unredacted."""
    from agent.io.jsonfile import MAX_DEPTH, nesting_depth

    data = path.read_bytes()
    if nesting_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise SnapshotError(f"JSON nested deeper than {MAX_DEPTH} levels: cannot redact it, "
                            "so no archive is written", path=rel)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _values(root: Path, kinds: tuple[str, ...]) -> dict[str, set[bytes]]:
    """kind -> the literal values to replace, found in the snapshot's files."""
    serials: set[str] = set()
    hosts: set[str] = set()
    macs: set[bytes] = set()
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if "serial" in path.name.lower() and rel.startswith("fs/"):
            serials.add(path.read_text("utf-8", "replace").strip())
        if path.suffix == ".json":
            loaded_json = _json_for_redaction(path, rel)
            _json_serials(loaded_json, serials)
            json_hosts(loaded_json, hosts)
        if rel in HOST_FILES:
            hosts.add(path.read_text("utf-8", "replace").strip())
        if re.fullmatch(r"fs/sys/class/net/[^/]+/address", rel):
            macs.add(path.read_bytes().strip())
    meta = root / "meta.yaml"
    if meta.is_file():
        import yaml

        loaded = yaml.safe_load(meta.read_text("utf-8", "replace"))
        if isinstance(loaded, dict) and isinstance(loaded.get("hostname"), str):
            hosts.add(loaded["hostname"])
    out: dict[str, set[bytes]] = {}
    if "serials" in kinds:
        out["serial"] = {s.encode() for s in serials if s.lower() not in _PLACEHOLDERS and len(s) >= 4}
    if "hostnames" in kinds:  # whatever their length (issue 36, 2): agent.sources.importers.redact_hosts says where
        out["host"] = {h.encode() for h in host_forms(hosts, _PLACEHOLDERS)}
    if "macs" in kinds:
        out["mac"] = {m for m in macs if m and set(m) - set(b"0:")}
    return out


class Redactor:
    """One mapping for the whole snapshot: a value always becomes the same token."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self.tokens: dict[bytes, bytes] = {}
        self.literals: dict[str, set[bytes]] = {}
        self.issued: set[bytes] = set()  # tokens handed out: a later pattern must not redact them again
        self.hosts: HostNames | None = None  # the host's names: by token, and only where that is safe
        self.notes: list[str] = []

    def token(self, kind: str, value: bytes) -> bytes:
        key = value.lower() if kind in ("uuid", "mac", "gid", "guid", "guid4", "ip6") else value
        if key not in self.tokens:
            n = sum(1 for t in self.tokens.values() if t.startswith(_PREFIX[kind])) + 1
            self.tokens[key] = _shape(kind, n)
            self.issued.add(self.tokens[key].lower())
        return self.tokens[key]

    def apply(self, data: bytes, rel: str | None = None) -> bytes:
        """`data`, the bytes of the file at `rel` (None: a file name in the Redfish tree), redacted."""
        for kind in ("serial", "host", "mac"):  # longest first: a serial that holds a hostname stays whole
            if kind == "host":
                data = self.hosts.apply(data, rel) if self.hosts is not None else data
                continue
            for value in sorted(self.literals.get(kind, ()), key=len, reverse=True):
                if value in data:
                    data = data.replace(value, self.token(kind, value))
        if "uuids" in self.kinds:
            data = _UUID_RE.sub(lambda m: self.token("uuid", m.group(0)), data)
        if "macs" in self.kinds:
            data = _MAC_RE.sub(lambda m: self.token("mac", m.group(0)), data)
        if "guids" in self.kinds:  # before IPv6: a GID keeps its GID-shaped token
            data = _GID_RE.sub(lambda m: self._keep_zero(m.group(0), "gid"), data)
            data = _GUID_RE.sub(lambda m: self._keep_zero(m.group(0), "guid"), data)
            data = _GUID4_RE.sub(lambda m: self._keep_zero(m.group(0), "guid4"), data)
        if "ips" in self.kinds:
            data = _IP_RE.sub(lambda m: m.group(0) if _not_an_ip(m.group(0)) else self.token("ip", m.group(0)), data)
            data = _IP6_RE.sub(lambda m: self._keep_zero(m.group(0), "ip6"), data)
        return data

    def _keep_zero(self, value: bytes, kind: str) -> bytes:
        """An all-zero GUID/GID (an unset port) or one of our own tokens stays as it is."""
        if not value.strip(b"0x:") or value.lower() in self.issued:
            return value
        return self.token(kind, value)

    def rename_tree(self, root: Path) -> None:
        """File and folder names under `root` with the same replacements (deepest first).

        Only for trees named by outside identifiers (a Redfish tree: resources by serial or host);
        fs/ holds kernel-defined names (EFI variables carry their vendor GUID) and is left as it is.
        """
        for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_symlink():
                continue
            name = self.apply(path.name.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")
            if name != path.name and "/" not in name and name not in (".", ".."):
                path.rename(path.with_name(name))


_PREFIX = {"serial": b"REDACTED-SN-", "host": b"redacted-host-", "uuid": b"00000000-0000-4000-8000-",
           "mac": b"02:00:00:", "ip": b"192.0.", "ip6": b"2001:db8::", "gid": b"fe80:0000:0000:0000:0000:0000:",
           "guid": b"0x00000000", "guid4": b"0000:0000:"}


def _not_an_ip(text: bytes) -> bool:
    """Kept: the well-known addresses, and version strings ("7.00.00.00": an address has no leading zeros)."""
    return text in _KEEP_IPS or any(len(p) > 1 and p.startswith(b"0") for p in text.split(b"."))


def _shape(kind: str, n: int) -> bytes:
    if kind == "uuid":
        return _PREFIX[kind] + f"{n:012x}".encode()
    if kind == "mac":
        return _PREFIX[kind] + f"{n >> 16 & 0xFF:02x}:{n >> 8 & 0xFF:02x}:{n & 0xFF:02x}".encode()
    if kind == "ip":
        return _PREFIX[kind] + f"{2 + (n >> 8) % 254}.{n % 256}".encode()  # TEST-NET style, never routable here
    if kind == "ip6":
        return _PREFIX[kind] + f"{n:x}".encode()  # 2001:db8::/32, the documentation prefix
    if kind == "gid":
        return _PREFIX[kind] + f"{n >> 16 & 0xFFFF:04x}:{n & 0xFFFF:04x}".encode()
    if kind == "guid":
        return _PREFIX[kind] + f"{n:08x}".encode()
    if kind == "guid4":
        return _PREFIX[kind] + f"{n >> 16 & 0xFFFF:04x}:{n & 0xFFFF:04x}".encode()
    return _PREFIX[kind] + f"{n:04d}".encode()


def redact_tree(root: Path, kinds: tuple[str, ...]) -> Redactor:
    """Rewrite every file under `root` (a private folder we just filled) with the values replaced."""
    redactor = Redactor(kinds)
    redactor.literals = _values(root, kinds)
    if names := {h.decode() for h in redactor.literals.get("host", ())}:
        kernel_data = (p.read_bytes() for p in _files(root) if is_kernel_data(p.relative_to(root).as_posix()))
        redactor.hosts = HostNames(names, unsafe_names(names, kernel_data), lambda v: redactor.token("host", v))
    for path in _files(root):
        data = path.read_bytes()
        rel = path.relative_to(root).as_posix()
        new = redactor.apply(data, rel)
        if redactor.hosts is not None:
            redactor.hosts.check(new, rel)
        if new != data:
            path.write_bytes(new)  # our own 0700 temporary folder, never a link (rglob files, checked)
    if (root / "redfish").is_dir():
        redactor.rename_tree(root / "redfish")
    if redactor.hosts is not None and (notes := redactor.hosts.notes()):
        _add_notes(root / "meta.yaml", notes)
        redactor.notes += notes
    return redactor


def _add_notes(meta: Path, notes: list[str]) -> None:
    """meta.yaml's `redaction_notes`: what a redacted archive still holds, said in the archive itself."""
    import yaml

    loaded = yaml.safe_load(meta.read_text("utf-8", "replace")) if meta.is_file() else None
    if isinstance(loaded, dict):
        loaded["redaction_notes"] = notes
        meta.write_text(yaml.safe_dump(loaded, sort_keys=False), "utf-8")  # our own 0700 folder, as above


# --- writing and reading the archive --------------------------------------------------------------


def capture_archive(out: Path, capture: Callable[[Path], list[str]], redact: tuple[str, ...] = ()) -> list[str]:
    """Capture into a private folder beside `out`, redact, pack as .tar.gz and publish it at `out` (new)."""
    from agent.io.fsout import OutputDir  # built in a folder held by descriptor (issue 21, 2)

    with OutputDir(out, what="archive", replace_empty=False) as work:  # refuses an existing `out` or an unsafe parent
        top = out.name.removesuffix(".tgz").removesuffix(".tar.gz") or "snapshot"
        # The files are captured into a private scratch folder (in memory where `scratch_dir` finds room: its
        # thousands of small files are what made an archive slow), only the archive goes beside `out`.
        scratch = Path(tempfile.mkdtemp(prefix=f"{_EXTRACT_PREFIX}{os.getpid()}-", dir=scratch_dir()))
        try:
            snap = scratch / top
            captured = capture(snap)
            if redact:
                for note in redact_tree(snap, redact).notes:  # said on the terminal too, not only in the archive
                    logging.getLogger("nodewarden.snapshot").warning("snapshot capture: %s", note)
            fd = os.open("snapshot.tar.gz", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=work.fd)
            with os.fdopen(fd, "wb") as handle:
                # gzip's own default level: level 9 (tarfile's) took twice as long for 3 % less
                with tarfile.open(fileobj=handle, mode="w:gz", compresslevel=6) as archive:
                    for member in with_progress(_members(snap), f"packing {out.name}"):
                        archive.add(member, arcname=f"{top}/{member.relative_to(snap)}" if member != snap else top,
                                    recursive=False, filter=_clean)
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        work.publish("snapshot.tar.gz")  # renameat2(RENAME_NOREPLACE): never over what appeared meanwhile
        work.discard()
    return captured


def _members(root: Path) -> Iterator[Path]:
    """`root` and everything under it, folders before their files, in a stable order (as tarfile.add walks)."""
    yield root
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            yield Path(folder) / name


def _clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if not (info.isfile() or info.isdir()):
        return None  # a snapshot holds links as fs_links.json, never as links
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def extract_archive(path: Path) -> Path:
    """A snapshot archive's files in a private temporary folder (removed at exit); the snapshot folder in it."""
    from agent.sources.importers.bundle import put_file
    from agent.sources.importers.inputs import Reader

    _remove_stale_extractions()
    # Named with our pid, so that a later run can tell a folder left by a killed one (SIGKILL) from a live one's.
    work = Path(tempfile.mkdtemp(prefix=f"{_EXTRACT_PREFIX}{os.getpid()}-", dir=scratch_dir()))
    atexit.register(shutil.rmtree, work, True)
    _exit_on_terminate()
    prefix = f"{path}:"
    archives = []  # an archive's error is known only once it was read to its end (or was not)
    for entry in with_progress(Reader().read_paths([path]), f"unpacking {path.name}"):
        if entry.error and entry.name == str(path):
            raise SnapshotError(f"not a snapshot archive: {entry.error}", path=str(path))
        if entry.kind and entry.kind.endswith("archive"):
            archives.append(entry)
        if entry.error:
            raise SnapshotError(f"refused: {entry.name.removeprefix(prefix)}: {entry.error}", path=str(path))
        if entry.data is None or not entry.name.startswith(prefix):
            continue
        try:
            put_file(work, entry.name[len(prefix):], entry.data)
        except OSError as exc:  # $TMPDIR full or failing: the machine's fault (exit 1); a bad name: the input's (2)
            from agent.core.errors import EnvironmentFault

            kind = EnvironmentFault if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO) else SnapshotError
            raise kind(f"cannot unpack {entry.name.removeprefix(prefix)} into {work.parent}: "
                       f"{exc.strerror or exc}", path=str(path)) from None
    for entry in archives:  # never audited in part: a snapshot is judged whole or not at all
        if entry.error:
            where = "" if entry.name == str(path) else f"{entry.name.removeprefix(prefix)}: "
            raise SnapshotError(f"refused: {where}{entry.error}: an archive that does not read to its end is "
                                "never audited in part (copy it again)", path=str(path))
    candidates = [work] if (work / "meta.yaml").is_file() else [p for p in work.iterdir()
                                                                 if (p / "meta.yaml").is_file()]
    if len(candidates) != 1:
        raise SnapshotError("not a snapshot archive: no single folder with meta.yaml in it", path=str(path))
    return candidates[0]


_EXTRACT_PREFIX = "nodewarden-snapshot-"


def scratch_dir() -> str | None:
    """Where a snapshot is unpacked or packed: /dev/shm (memory) when $TMPDIR is not set and it is a tmpfs
    with room for the largest archive we unpack (MAX_TOTAL), else $TMPDIR (None: tempfile's choice).

    Thousands of small files created and removed again are what made an archive ~5x slower than its
    folder: on a journalled disk mounted with `discard` each costs ~100 us each way, in memory ~20.
    The folder is private either way (mkdtemp: 0700, a random name) and removed at exit.
    """
    from agent.sources.importers.input_streams import MAX_TOTAL

    if os.environ.get("TMPDIR"):
        return None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            tmpfs = any(line.split()[1:3] == [_SHM, "tmpfs"] for line in mounts if len(line.split()) > 2)
        info = os.statvfs(_SHM)
        usable = stat.S_ISDIR(os.lstat(_SHM).st_mode) and os.access(_SHM, os.W_OK | os.X_OK)
    except OSError:
        return None
    return _SHM if tmpfs and usable and info.f_bavail * info.f_frsize > 2 * MAX_TOTAL else None


_SHM = "/dev/shm"  # noqa: S108 - a private mkdtemp folder in it (0700, random name), never a fixed path
PROGRESS_AFTER_S = 2.0  # a terminal sees progress for anything that takes longer


def with_progress(items: Iterable[T], label: str) -> Iterator[T]:
    """`items`, with click's progress bar on stderr once they have taken PROGRESS_AFTER_S, on a terminal."""
    import sys
    import time

    import click

    started, bar, count = time.monotonic(), None, 0
    shown = sys.stderr.isatty()
    try:
        for item in items:
            count += 1
            if bar is None and shown and time.monotonic() - started > PROGRESS_AFTER_S:
                # its length unknown (files still coming): click draws a moving bar and the count
                bar = click.progressbar((_ for _ in ()), label=label, show_pos=True, file=sys.stderr)
                bar.__enter__()
                bar.update(count)
            elif bar is not None:
                bar.update(1)
            yield item
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)


def _remove_stale_extractions() -> None:
    """Remove the folders that runs killed before their clean-up left in $TMPDIR (or /dev/shm,
    `scratch_dir`): ours by name and owner, whose pid is gone. shutil.rmtree works by descriptor, so a
    link planted inside one leads nowhere."""
    for base in {tempfile.gettempdir(), scratch_dir() or tempfile.gettempdir()}:
        _remove_stale_in(base)


def _remove_stale_in(base: str) -> None:
    try:
        names = [n for n in os.listdir(base) if n.startswith(_EXTRACT_PREFIX)]
    except OSError:
        return
    for name in names:
        pid_text = name[len(_EXTRACT_PREFIX):].partition("-")[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or not a pid we can ask about): not ours to judge
    return True


def _exit_on_terminate() -> None:
    """SIGTERM (whose default ends the process without clean-up) becomes a normal exit, so the extracted
    snapshot is removed; SIGINT already raises KeyboardInterrupt. A handler set by someone else (the
    daemon's) stays as it is."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
