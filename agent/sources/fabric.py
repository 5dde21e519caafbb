"""NVSwitch fabric: is Fabric Manager running, what its log says, SXid errors in the kernel log.

Everything is read through the host's `FsRoot`, so a snapshot records it in
its fs/ tree like any other file and replays it through the same parsers:

* Fabric Manager's state comes from systemd's cgroup of the service, never
  from a shell or systemctl: `/sys/fs/cgroup/system.slice/nvidia-fabricmanager.service/cgroup.procs`
  (cgroup v2; v1 under `/sys/fs/cgroup/systemd/`) lists its PIDs while it
  runs, and systemd removes the directory when the service stops. Only where
  no systemd cgroup hierarchy is visible at all (no systemd, a container)
  does the reader look for a process named `nv-fabricmanager` in /proc, and
  then for at most `MAX_PROC_SCAN` processes.
* `/var/log/fabricmanager.log` grows for the life of the node (hundreds of
  MB are common): only its last `FM_LOG_TAIL_BYTES` are read, seeking from
  the end, from the first full line on.
* SXid lines (`nvidia-nvswitchN: SXid (PCI:...): 12028, Non-fatal, Link 32 ...`)
  are parsed from the kernel log records the engine already read; the
  driver's follow-on lines for the same error ("Severity 1 Engine instance
  ...", "Data {...}") are not separate errors.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import stat
from collections.abc import Iterable

from agent.core.facts import FabricFacts, KmsgRecord, NvSwitchError
from agent.core.model import Unknown
from agent.sources.fsroot import FsRoot, LiveFs, read_tail_fd
from agent.sources.fsroot_recording import RecordingFs
from agent.sources.fsroot_snapshot import SnapshotFs

FM_SERVICE = "nvidia-fabricmanager.service"
CGROUP_V2_SLICE = "/sys/fs/cgroup/system.slice"
CGROUP_V1_SLICE = "/sys/fs/cgroup/systemd/system.slice"
FM_CGROUP_PROCS = (f"{CGROUP_V2_SLICE}/{FM_SERVICE}/cgroup.procs", f"{CGROUP_V1_SLICE}/{FM_SERVICE}/cgroup.procs")
FM_COMM = "nv-fabricmanager"
FM_LOG = "/var/log/fabricmanager.log"
FM_LOG_TAIL_BYTES = 1 << 20  # ~10,000 lines of Fabric Manager's log: days of a busy node
MAX_PROC_SCAN = 4096  # processes looked at by the /proc fallback, at most
_CGROUP_PROCS_BYTES = 1 << 16

# [Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on
# NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61
_FM_ERROR_RE = re.compile(
    r"(?:\[(?P<when>[A-Z][a-z]{2} +\d{1,2} \d{4} \d{2}:\d{2}:\d{2})\] )?.*?"
    r"detected NVSwitch (?P<kind>fatal|non-fatal) error (?P<code>\d+)"
    r"(?: on fid \d+)?(?: on NVSwitch pci bus id (?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7]))?(?: physical id (?P<phys>\d+))?(?: port (?P<port>\d+))?")
_FM_MARK = "detected NVSwitch"
# nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
_SXID_RE = re.compile(r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                      r"(?:\.([0-7]))?\): (\d+), ?(.*)$")
_LINK_RE = re.compile(r"^Link (\d+)\b[,:]? ?(.*)$")
_FM_TIME_FORMAT = "%b %d %Y %H:%M:%S"
_MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}  # C locale %b


def _describe(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path} is absent"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path} is not readable by this user (needs root)"
    return f"{path}: {exc.strerror or exc}"


# --- Fabric Manager service ---------------------------------------------------------------------


def read_manager(fs: FsRoot) -> tuple[str | Unknown, str]:
    """('active' | 'inactive' | Unknown, how it was decided)."""
    for path in FM_CGROUP_PROCS:
        try:
            data = fs.read_bytes(path, _CGROUP_PROCS_BYTES)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            return Unknown(f"{_describe(path, exc)}: cannot tell whether Fabric Manager runs"), ""
        pids = [token for token in data.split() if token.isdigit()]
        if pids:
            return "active", f"PID {int(pids[0])} in {path}"
        return "inactive", f"{path} lists no process (the service is stopping or failed)"
    if fs.is_dir(CGROUP_V2_SLICE) or fs.is_dir(CGROUP_V1_SLICE):
        return "inactive", (f"systemd has no cgroup for {FM_SERVICE} under {CGROUP_V2_SLICE}: the service is "
                            "stopped, failed or not installed")
    return _scan_proc(fs)


def _scan_proc(fs: FsRoot) -> tuple[str | Unknown, str]:
    """Fallback without systemd cgroups: a process named nv-fabricmanager, bounded."""
    try:
        names = fs.listdir("/proc")
    except OSError as exc:
        return Unknown(f"no systemd cgroup under /sys/fs/cgroup and {_describe('/proc', exc)}: "
                       "cannot tell whether Fabric Manager runs"), ""
    pids = [name for name in names if name.isdigit()]
    if not pids:
        return Unknown("no systemd cgroup under /sys/fs/cgroup and no process list in /proc: "
                       "cannot tell whether Fabric Manager runs"), ""
    if len(pids) > MAX_PROC_SCAN:
        return Unknown(f"no systemd cgroup under /sys/fs/cgroup and {len(pids)} processes in /proc "
                       f"(more than the {MAX_PROC_SCAN} the agent looks at)"), ""
    for pid in pids:
        try:
            comm = fs.read_bytes(f"/proc/{pid}/comm", 64)
        except OSError:
            continue  # exited meanwhile, or hidden (hidepid)
        if comm.strip() == FM_COMM.encode():
            return "active", f"process {pid} is {FM_COMM} (no systemd cgroup under /sys/fs/cgroup)"
    return "inactive", f"no {FM_COMM} among {len(pids)} processes (no systemd cgroup under /sys/fs/cgroup)"


# --- bounded tail read --------------------------------------------------------------------------


def _open_tail(fs: FsRoot, path: str) -> int | None:
    """A descriptor of `path` for roots the tail reader can seek in; None for other roots.

    In a snapshot the file is opened inside fs/ only (no real symlink followed, no FIFO or device opened).
    """
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"not an absolute path: {path!r}")
    if isinstance(fs, SnapshotFs):
        return fs.open_file(path)
    if isinstance(fs, LiveFs):
        real = path if fs.root == "/" else os.path.join(fs.root, path.lstrip("/"))
        try:
            return os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
    return None


def _tail_of(fd: int, path: str, limit: int) -> tuple[bytes, int, int]:
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return read_tail_fd(fd, limit)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        os.close(fd)


def read_tail(fs: FsRoot, path: str, limit: int = FM_LOG_TAIL_BYTES) -> tuple[bytes, int, int]:
    """The last `limit` bytes of `path` from a line start: (data, file size, bytes read).

    Raises OSError. Seeks from the end on a live root and in a snapshot; a
    recording root stores the tail it read, so the snapshot holds the same lines.
    """
    if isinstance(fs, RecordingFs):
        key = fs.inner.realpath(path).lstrip("/")
        try:
            data, size, read = read_tail(fs.inner, path, limit)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0)
            if name and exc.errno != errno.ENOENT:
                fs.errors[key] = name
            raise
        fs.files[key] = data
        return data, size, read
    fd = _open_tail(fs, path)
    if fd is None:  # another root: its own bounded read, then the tail of that
        data = fs.read_bytes(path)
        tail = data[-limit:]
        if len(data) > limit:
            cut = tail.find(b"\n")
            tail = tail[cut + 1:] if cut >= 0 else b""
        return tail, len(data), len(data)
    return _tail_of(fd, path, limit)


# --- Fabric Manager log -------------------------------------------------------------------------


def _address(domain: str, bus: str, device: str, function: str | None) -> str:
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"


def parse_fm_log(text: str) -> tuple[NvSwitchError, ...]:
    """NVSwitch errors Fabric Manager logged ("detected NVSwitch non-fatal error 12028 ... port 61").

    Only the lines holding the marker are matched: a MiB of INFO lines costs one substring search.
    """
    errors: list[NvSwitchError] = []
    pos = text.find(_FM_MARK)
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        match = _FM_ERROR_RE.match(text, start, end)
        if match:
            address = (_address(match["domain"], match["bus"], match["dev"], match["fn"])
                       if match["domain"] else None)
            errors.append(NvSwitchError(
                sxid=int(match["code"]), fatal=match["kind"] == "fatal", switch=None, pci_address=address,
                link=int(match["port"]) if match["port"] else None, message=text[pos:end].rstrip(),
                source="fmlog", when=" ".join(match["when"].split()) if match["when"] else None))
        pos = text.find(_FM_MARK, end)
    return tuple(errors)


def fm_log_time(when: str | None) -> dt.datetime | None:
    """Fabric Manager's time stamp (node-local time, no zone) as a naive datetime."""
    if not when:
        return None
    parts = when.split(" ")
    clock = parts[3].split(":") if len(parts) == 4 else []
    numbers = [parts[2], parts[1], *clock] if len(clock) == 3 else []
    # The form Fabric Manager writes ("Jul 09 2024 18:14:07") is read directly: strptime's first
    # call builds its locale tables and patterns (~2 ms). Any other form goes to strptime.
    if parts[0] in _MONTHS and numbers and all(n.isascii() and n.isdigit() for n in numbers) and \
            len(parts[2]) == 4 and all(1 <= len(n) <= 2 for n in numbers[1:]):
        year, day, hour, minute, second = (int(n) for n in numbers)
        try:
            return dt.datetime(year, _MONTHS[parts[0]], day, hour, minute, second)
        except ValueError:
            return None
    try:
        return dt.datetime.strptime(when, _FM_TIME_FORMAT)
    except ValueError:
        return None


def read_fm_log(fs: FsRoot, limit: int = FM_LOG_TAIL_BYTES,
                ) -> tuple[tuple[NvSwitchError, ...] | Unknown, int, int | None]:
    """(errors in the log's tail or Unknown, bytes read, file size)."""
    try:
        data, size, read = read_tail(fs, FM_LOG, limit)
    except OSError as exc:
        return Unknown(_describe(FM_LOG, exc)), 0, None
    return parse_fm_log(data.decode("utf-8", "backslashreplace")), read, size


def read_fabric(fs: FsRoot) -> FabricFacts:
    manager, how = read_manager(fs)
    errors, read, size = read_fm_log(fs)
    return FabricFacts(manager=manager, manager_how=how, log_errors=errors, log_read_bytes=read, log_size=size)


# --- kernel log (SXid) --------------------------------------------------------------------------


def parse_sxid(record: KmsgRecord) -> NvSwitchError | None:
    """One SXid record; None for other records and for an error's follow-on lines."""
    if "SXid" not in record.message:
        return None
    match = _SXID_RE.search(record.message)
    if not match:
        return None
    index, domain, bus, device, function, code, rest = match.groups()
    rest = rest.strip()
    if rest.startswith(("Severity ", "Data {", "Data{")):
        return None  # details of the error logged on the line before
    fatal: bool | None = None
    for word, value in (("Fatal", True), ("Non-fatal", False)):
        if rest == word or rest.startswith(word + ","):
            fatal, rest = value, rest[len(word) + 1:].strip()
            break
    link: int | None = None
    if m := _LINK_RE.match(rest):
        link, rest = int(m.group(1)), m.group(2).strip()
    rest = rest.removesuffix("(First)").strip()  # the driver marks an error's first report
    return NvSwitchError(sxid=int(code), fatal=fatal, switch=f"nvswitch{int(index)}",
                         pci_address=_address(domain, bus, device, function), link=link, message=rest,
                         ts_usec=record.ts_usec)


def parse_sxids(records: Iterable[KmsgRecord]) -> tuple[NvSwitchError, ...]:
    return tuple(event for event in (parse_sxid(r) for r in records) if event is not None)
