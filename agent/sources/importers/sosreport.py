"""The `sosreport` kind: a sos report (`sos report`, formerly `sosreport`), as a folder or a tarball.

A sos report is a tree: the files its plugins copied, at their path on the node (`proc/`, `sys/`,
`etc/`, `var/`, ...), the output of the commands they ran (`sos_commands/<plugin>/<command>`, the
command line with spaces as `_`), and sos's own `sos_reports/`, `sos_logs/` and `version.txt`.
Each file reaches an importer on its own; which tree a file belongs to is found from its name
(the folder or archive member path): the tree's root is the folder holding `sos_commands/` (or
`sos_reports/`, `sos_logs/`). A file is only judged once every input is read (`finish`), because a
tarball may list `proc/` before `sos_commands/`. A file that turns out to be in no sos report (a
folder that merely has a `proc/` or `etc/` in its path) is detected by content like any input.

What the host reader reads, from one tree (the first input to give a file wins):

* `proc/**` and `sys/**` go to the snapshot's fs/ as they are (sysctls under proc/sys, the
  kernel command line, /proc/modules, THP, DMI, net, ...; each bounded and its path checked by
  `Builder.put_fs`), as do `etc/sysctl.conf` and `etc/sysctl.d/*`;
* `sos_commands/kernel/sysctl_-a` -> proc/sys/<key> (what the copied files do not hold);
  `kernel/uname_-a` -> the kernel release, `host/hostname` -> the hostname,
  `kernel/lsmod` -> /proc/modules when it was not copied, `networking/ip_-d_address` (and
  `ethtool_<if>`'s speed) -> sys/class/net/<if>/{mtu,operstate,type,address,speed}, and
  `date/date_--utc` -> when it was captured;
* the outputs nodewarden already imports go to those importers, one view each:
  `kernel/dmesg` (else `dmesg_-T`) -> kernel-log, `pci/lspci_-nnvv` -> lspci,
  `hardware/dmidecode` -> dmidecode, `infiniband/ibstat` -> ibstat, `ipmitool/*` -> ipmitool,
  `nvidia/nvidia-smi_-q` -> nvidia-smi.

Everything else in the tree is listed as not used.

Symlinks in the tree (sos keeps them) come from `inputs` as link entries, their target's text only,
never followed: those where the copied files are (`sys/class/net/eth0 -> ../../devices/.../net/eth0`,
`etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf`) become recorded links (fs_links.json, resolved inside
the snapshot by `SnapshotFs`, as `agent.sources.importers.sysfs_tree` records them); sos's top-level shortcuts
(`lsmod -> sos_commands/kernel/lsmod`, `uname`, `hostname`, ...) are named as the file they point to,
read there; any other is listed as not used. The interfaces `ip -d address` and `ethtool` describe are
written where `sys/class/net/<if>` leads, and a value the copied sysfs files hold wins over theirs.
A file of a tree that is no sos report but a copy of sysfs (`sys/class/...`, `sys/devices/...`) is
the `sysfs-tree` kind's (`sysfs_tree.take_trees`); the rest is detected by content.
"""

from __future__ import annotations

import collections
import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.sources.importers.base import (
    HEAD_BYTES,
    MAX_KMSG_LINES,
    Builder,
    Contribution,
    Importer,
    InputError,
    decode_text,
    detect_kind,
    looks_binary,
    run_importer,
    valid_fs_path,
)
from agent.sources.importers.inputs import Entry
from agent.sources.importers.sysfs_tree import Placer, lexical_target, resolve, take_link, take_trees

MAX_HELD = 512 << 20  # bytes held until every input is read
MAX_SYSCTLS = 20_000
MAX_INTERFACES = 1024
_TOP = "sos_commands|sos_reports|sos_logs|sos_strings|proc|sys|etc|var|usr|lib|lib64|run|boot|opt|root|home"
_SPLIT_RE = re.compile(rf"(?:^|(?<=[/:]))(?:(?:{_TOP})/[^/]|(?:version\.txt|environment)$)")
_NAMED_RE = re.compile(r"(?:^|(?<=[/:]))sosreport[^/:]*/")  # sos report's own folder name (its tarball's too)
_NAMED_ROOT_RE = re.compile(r"(?:^|[/:])sosreport[^/:]*/$")
_SOS_DIRS = ("sos_commands/", "sos_reports/", "sos_logs/")
_COPIED = re.compile(r"^(?:proc/.+|sys/.+|etc/sysctl\.conf|etc/sysctl\.d/[^/]+)$")
_DERIVED = ("sos_commands/kernel/sysctl_-a", "sos_commands/kernel/uname_-a", "sos_commands/host/hostname",
            "sos_commands/kernel/lsmod", "sos_commands/networking/ip_-d_address", "sos_commands/date/date_--utc")
_ETHTOOL_RE = re.compile(r"^sos_commands/networking/ethtool_([A-Za-z0-9_.:@-]{1,15})$")
_IPMITOOL_RE = re.compile(r"^sos_commands/ipmitool/ipmitool_[^/]+$")
# kind -> the files that hold it, preferred first: the first that imports is used, the rest are other views
_DELEGATED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel-log", ("sos_commands/kernel/dmesg", "sos_commands/kernel/dmesg_-T")),
    ("lspci", ("sos_commands/pci/lspci_-nnvv", "sos_commands/pci/lspci_-nvv", "sos_commands/pci/lspci_-vvv")),
    ("dmidecode", ("sos_commands/hardware/dmidecode",)),
    ("ibstat", ("sos_commands/infiniband/ibstat", "sos_commands/infiniband/ibstatus")),
    ("nvidia-smi", ("sos_commands/nvidia/nvidia-smi_-q", "sos_commands/nvidia/nvidia-smi_-q_-x")),
)
_DELEGATED_FILES = {path for _kind, paths in _DELEGATED for path in paths}
_IFACE_RE = re.compile(r"^\d+:\s+([^:@\s]+)(?:@[^:\s]+)?:\s+<([^>]*)>(.*)$")
_ARP_TYPES = {"ether": 1, "loopback": 772, "infiniband": 32, "none": 65534, "ipip": 768, "sit": 776, "gre": 778}
_DATE_RE = re.compile(r"^\w{3} (\w{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (?:UTC|GMT) (\d{4})$")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def splits(name: str) -> list[tuple[str, str]]:
    """Every (root, path in the tree) an entry's name may be: "/x/sosreport-h/proc/cmdline" ->
    [("/x/sosreport-h/", "proc/cmdline")]; the root is settled by where `sos_commands/` is."""
    found = {(name[:m.start()], name[m.start():]) for m in _SPLIT_RE.finditer(name)}
    found |= {(name[:m.end()], name[m.end():]) for m in _NAMED_RE.finditer(name) if m.end() < len(name)}
    return sorted(found, key=lambda pair: len(pair[0]))


def _claimed(root: str, rel: str) -> bool:
    """Whether a file is one this kind waits for: sos's own folders, what it copied that the host reader
    reads, or anything in a folder named as sos names its reports (sosreport-<host>-...)."""
    return bool(rel.startswith(_SOS_DIRS) or _COPIED.match(rel) or rel == "version.txt"
                or _NAMED_ROOT_RE.search(root))


def _wanted(rel: str) -> bool:
    return bool(_COPIED.match(rel) or rel in _DERIVED or rel in _DELEGATED_FILES or _ETHTOOL_RE.match(rel)
                or _IPMITOOL_RE.match(rel) or rel == "version.txt")


@dataclass
class _Held:
    name: str
    splits: list[tuple[str, str]]
    data: bytes | None  # None: not needed (or past MAX_HELD)
    dropped: bool = False


@dataclass
class _Tree:
    root: str
    files: dict[str, _Held] = field(default_factory=dict)
    links: dict[str, Entry] = field(default_factory=dict)  # link entries (target text only), by path in the tree


class SosreportImporter:
    """Claims the files of a sos report tree by their path; `finish` judges them once every input is read."""

    kind = "sosreport"

    def __init__(self, others: list[Importer]) -> None:
        self.others = others  # for what the report holds of their kinds, and for files in no sos report
        self._held: list[_Held] = []
        self._roots: set[str] = set()
        self._bytes = 0

    def detect(self, head: bytes, name: str) -> bool:
        return any(_claimed(root, rel) for root, rel in splits(name))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        return self._hold(builder.current, lambda: data)

    def contribute_lines(self, lines: Iterable[str], builder: Builder) -> Contribution:
        """A large member (over inputs.STREAM_ABOVE), streamed: one this kind does not use is never read
        (its owner drains it for the checksum); one it uses is kept as its newest MAX_KMSG_LINES lines,
        all that a kernel log can give a snapshot (and more than any other sos file holds)."""
        return self._hold(builder.current,
                          lambda: "".join(collections.deque(lines, maxlen=MAX_KMSG_LINES)).encode("utf-8"))

    def _hold(self, name: str, data_of: Callable[[], bytes]) -> Contribution:
        found = splits(name)
        if not found:
            raise InputError("not a file of a sos report tree (sos_commands/, proc/, sys/, etc/ ...)")
        for root, rel in found:
            if rel.startswith(_SOS_DIRS):
                self._roots.add(root)
        known = [rel for root, rel in found if root in self._roots]
        needed = not known or _wanted(known[-1])
        held = _Held(name, found, None)
        if needed:
            data = data_of()
            if self._bytes + len(data) <= MAX_HELD:
                held.data = data
                self._bytes += len(data)
            else:
                held.dropped = True
        self._held.append(held)
        return Contribution()  # filled in by `finish`

    # --- once every input is read ----------------------------------------------------------------

    def finish(self, builder: Builder, entries: list[Entry]) -> None:
        by_name = {e.name: e for e in entries}
        trees: dict[str, _Tree] = {}
        loose: list[_Held] = []
        for held in self._held:
            if held.name not in by_name:
                continue
            mine = [(root, rel) for root, rel in held.splits if root in self._roots]
            if not mine:
                loose.append(held)
                continue
            root, rel = max(mine, key=lambda pair: len(pair[0]))
            trees.setdefault(root, _Tree(root)).files.setdefault(rel, held)
        for entry in entries:
            if entry.link is None or entry.kind != "symlink":
                continue
            mine = [(root, rel) for root, rel in splits(entry.name) if root in self._roots]
            if mine:
                root, rel = max(mine, key=lambda pair: len(pair[0]))
                trees.setdefault(root, _Tree(root)).links.setdefault(rel, entry)
        previous = builder.current
        try:
            for tree in trees.values():
                _judge_tree(tree, builder, by_name, self.others)
            taken = take_trees([(h.name, h.data) for h in loose if h.data is not None], entries, builder)
            for held in loose:
                if held.name not in taken:
                    _not_in_a_report(held, builder, by_name[held.name], self.others)
        finally:
            builder.current = previous
            self._held, self._bytes = [], 0


def _note(entry: Entry, result: Contribution, prefix: str = "") -> None:
    entry.contributed += [prefix + item for item in result.contributed]
    entry.skipped += [prefix + item for item in result.skipped]


def _not_in_a_report(held: _Held, builder: Builder, entry: Entry, others: list[Importer]) -> None:
    """A file claimed by its path that is in no sos report: detected by content, as any input."""
    if held.data is None:
        entry.kind = "unknown"
        entry.skipped.append(f"not in a sos report, and not kept to detect it (more than {MAX_HELD >> 20} MiB "
                             "waited for the rest of the inputs)")
        return
    importer = detect_kind(held.data[:HEAD_BYTES], held.name, others)
    if importer is None:
        entry.kind = "unknown"
        entry.skipped.append("not a kind nodewarden imports (binary)" if looks_binary(held.data[:4096]) else
                             "not a kind nodewarden imports (and in no sos report: no sos_commands/ beside it); "
                             "name one with --as KIND=FILE")
        return
    entry.kind = importer.kind
    try:
        _note(entry, run_importer(importer, held.data, builder, held.name))
    except InputError as exc:
        entry.error = exc.message


def _judge_tree(tree: _Tree, builder: Builder, by_name: dict[str, Entry], others: list[Importer]) -> None:
    files = tree.files
    used: set[str] = set()

    def begin(rel: str) -> tuple[Entry, bytes, Contribution] | None:
        held = files.get(rel)
        if held is None:
            return None
        used.add(rel)
        entry = by_name[held.name]
        if held.data is None:
            entry.skipped.append(f"not read: more than {MAX_HELD >> 20} MiB waited for the rest of the inputs")
            return None
        builder.current = held.name
        return entry, held.data, Contribution()

    # 1. the files sos copied, as they are, and its links among them
    placer = Placer(builder)
    for rel in sorted(r for r in files if _COPIED.match(r)):
        got = begin(rel)
        if got is None:
            continue
        entry, data, result = got
        if placer.file(rel, data, result):
            result.contributed.append(f"/{rel}")
        _note(entry, result)
    for rel, link in sorted(tree.links.items()):
        builder.current = link.name
        target = take_link(link, "sosreport")
        result = Contribution()
        if _COPIED.match(rel):
            placer.link(rel, target, result)
        elif "/" not in rel and (alias := lexical_target(rel, target)) and not alias[1] and alias[0] in files:
            result.skipped.append(f"/{rel}: sos's shortcut to /{alias[0]}: read there")
        else:
            result.skipped.append(f"/{rel}: a symlink (to {target[:120]!r}): not followed, not used by the audit")
        _note(link, result)
    # 2. the commands whose output becomes host files
    for rel, handler in (("sos_commands/kernel/sysctl_-a", _sysctl_a), ("sos_commands/kernel/uname_-a", _uname),
                         ("sos_commands/host/hostname", _hostname), ("sos_commands/date/date_--utc", _date)):
        if got := begin(rel):
            entry, data, result = got
            handler(decode_text(data), builder, result)
            _note(entry, result)
    kinds = {importer.kind: importer for importer in others}

    def own_kind(kind: str, entry: Entry, data: bytes) -> bool:
        """Handed to the importer of `kind` where there is one and it knows this output."""
        importer = kinds.get(kind)
        if importer is None or not importer.detect(data[:HEAD_BYTES], entry.name):
            return False
        _delegate(importer, entry, data, builder)
        return True

    if got := begin("sos_commands/kernel/lsmod"):
        entry, data, result = got
        if "proc/modules" in files:
            result.skipped.append("/proc/modules: copied into the report, used instead")
        elif not own_kind("lsmod", entry, data):
            _lsmod(decode_text(data), builder, result)
        _note(entry, result)
    names: set[str] = set()
    if got := begin("sos_commands/networking/ip_-d_address"):
        entry, data, result = got
        names = _ip_address(decode_text(data), builder, result)
        _note(entry, result)
    for rel in sorted(r for r in files if _ETHTOOL_RE.match(r)):
        match = _ETHTOOL_RE.match(rel)
        if match and (got := begin(rel)):
            entry, data, result = got
            if not own_kind("ethtool", entry, data):
                if match.group(1) in names:
                    _ethtool(match.group(1), decode_text(data), builder, result)
                else:
                    result.skipped.append(f"{match.group(1)}: not an interface ip -d address listed")
            _note(entry, result)
    # 3. the outputs of kinds nodewarden imports, one view each
    for kind, paths in _DELEGATED:
        done: str | None = None
        for rel in paths:
            if rel not in files:
                continue
            if done is not None or kind not in kinds:
                if begin(rel):
                    by_name[files[rel].name].skipped.append(
                        f"another view of /{done}: not used" if done else f"no {kind} importer: not used")
                continue
            if got := begin(rel):
                entry, data, _result = got
                if _delegate(kinds[kind], entry, data, builder):
                    done = rel
    ipmitool = kinds.get("ipmitool")
    for rel in sorted(r for r in files if _IPMITOOL_RE.match(r)):
        if ipmitool is not None and (got := begin(rel)):
            entry, data, _result = got
            if ipmitool.detect(data[:HEAD_BYTES], entry.name):
                _delegate(ipmitool, entry, data, builder)
    # 4. the rest
    for rel, held in files.items():
        if rel not in used:
            entry = by_name[held.name]
            entry.skipped.append(f"/{rel}: the sos report's own record" if rel.startswith(_SOS_DIRS[1:]) or
                                 rel == "version.txt" else f"/{rel}: not used by the audit")


def _delegate(importer: Importer, entry: Entry, data: bytes, builder: Builder) -> bool:
    try:
        part = run_importer(importer, data, builder, entry.name)
    except InputError as exc:
        entry.skipped.append(f"{importer.kind}: {exc.message}")
        return False
    _note(entry, part, f"{importer.kind}: ")
    return bool(part.contributed)


# --- command outputs that become host files ----------------------------------------------------


def _sysctl_a(text: str, builder: Builder, result: Contribution) -> None:
    """`sysctl -a` ("vm.swappiness = 60") -> proc/sys/vm/swappiness, as sysctl(8) reads it."""
    from agent.sources.host import InvalidName, sysctl_path

    added = odd = 0
    for line in text.splitlines()[:MAX_SYSCTLS]:
        key, sep, value = line.partition(" = ")
        if not sep:
            odd += bool(line.strip())
            continue
        try:
            path = sysctl_path(key.strip())
        except InvalidName:
            odd += 1
            continue
        if builder.put_fs(path, value.strip("\n") + "\n", Contribution()):
            added += 1
        if key.strip() == "kernel.hostname":
            builder.note_host(hostname=value.strip())
    if added:
        result.contributed.append(f"/proc/sys: {added} value(s) from sysctl -a")
    if odd:
        result.skipped.append(f"{odd} line(s) that are no 'key = value' sysctl")


def _uname(text: str, builder: Builder, result: Contribution) -> None:
    fields = text.split()
    if len(fields) >= 3 and fields[0] == "Linux":
        if builder.put_fs("proc/sys/kernel/osrelease", fields[2] + "\n", result):
            result.contributed.append(f"/proc/sys/kernel/osrelease: {fields[2][:80]}")
    else:
        result.skipped.append("not `uname -a` output of a Linux kernel")


def _hostname(text: str, builder: Builder, result: Contribution) -> None:
    name = text.strip().splitlines()[0].strip() if text.strip() else ""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}", name):
        builder.note_host(hostname=name)
        if builder.put_fs("proc/sys/kernel/hostname", name.split(".")[0] + "\n", result):
            result.contributed.append(f"/proc/sys/kernel/hostname: {name.split('.')[0]}")
    else:
        result.skipped.append("no hostname in it")


def _date(text: str, builder: Builder, result: Contribution) -> None:
    match = _DATE_RE.match(text.strip())
    if match is None or match.group(1) not in _MONTHS:
        result.skipped.append("not `date --utc` output")
        return
    month, day, hh, mm, ss, year = match.groups()
    try:
        when = dt.datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hh), int(mm), int(ss),
                           tzinfo=dt.timezone.utc)
    except ValueError:
        result.skipped.append("not a valid date")
        return
    builder.note_host(captured_at=when.isoformat())
    result.contributed.append(f"captured_at: {when.isoformat()}")


def _lsmod(text: str, builder: Builder, result: Contribution) -> None:
    """`lsmod` ("nvidia 54677504 182 nvidia_uvm,nvidia_modeset") -> /proc/modules lines."""
    lines = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[1].isdigit() or not re.fullmatch(r"-?\d+", fields[2]):
            continue
        deps = fields[3].rstrip(",") + "," if len(fields) > 3 else "-"
        lines.append(f"{fields[0]} {fields[1]} {fields[2]} {deps} Live 0x0000000000000000")
    if not lines:
        result.skipped.append("no module in it")
    elif builder.put_fs("proc/modules", "\n".join(lines) + "\n", result):
        result.contributed.append(f"/proc/modules: {len(lines)} module(s) from lsmod")


def _ip_address(text: str, builder: Builder, result: Contribution) -> set[str]:
    """`ip -d address` -> sys/class/net/<if>/{mtu,operstate,type,address} (bond masters get bonding/)."""
    names: set[str] = set()
    current: str | None = None
    for line in text.splitlines():
        if match := _IFACE_RE.match(line):
            name, rest = match.group(1), match.group(3)
            current = None
            if len(names) >= MAX_INTERFACES or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", name) or name in names:
                continue
            names.add(name)
            base = net_dir(builder, name)
            if base is None:
                result.skipped.append(f"{name}: /sys/class/net/{name} is a recorded link that leads nowhere a "
                                      "snapshot holds: its ip -d address facts are not recorded")
                continue
            current = name
            builder.add_dir(base)
            if m := re.search(r"\bmtu (\d+)", rest):
                builder.put_fs(f"{base}/mtu", m.group(1) + "\n", result)
            if m := re.search(r"\bstate ([A-Z]+)", rest):
                builder.put_fs(f"{base}/operstate", m.group(1).lower() + "\n", result)
            if m := re.search(r"\bmaster ([A-Za-z0-9_.:-]{1,15})\b", rest):
                master = f"../{m.group(1)}" if base == f"sys/class/net/{name}" else f"/sys/class/net/{m.group(1)}"
                builder.put_link(f"{base}/master", master, result)
            continue
        words = line.split()
        if current is None or not words:
            continue
        base = net_dir(builder, current) or f"sys/class/net/{current}"
        if words[0].startswith("link/"):
            arp = _ARP_TYPES.get(words[0].removeprefix("link/"))
            if arp is not None:
                builder.put_fs(f"{base}/type", f"{arp}\n", result)
            if len(words) > 1 and re.fullmatch(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5,19}", words[1]):
                builder.put_fs(f"{base}/address", words[1] + "\n", result)
        elif words[:2] == ["bond", "mode"]:
            builder.add_dir(f"{base}/bonding")
    if names:
        result.contributed.append(f"/sys/class/net: {len(names)} interface(s) from ip -d address "
                                  f"({', '.join(sorted(names)[:20])}{' ...' if len(names) > 20 else ''})")
    else:
        result.skipped.append("no interface in it")
    return names


def net_dir(builder: Builder, name: str) -> str | None:
    """Where /sys/class/net/<name>'s files are: through its recorded link (sos keeps the link and copies
    the device's folder), or the class folder itself; None when the link leads nowhere fs/ may hold."""
    base = f"sys/class/net/{name}"
    if base not in builder.links:
        return base
    real = resolve(builder.links, base)
    return real if real and real.startswith("sys/") and valid_fs_path(real) else None


def _ethtool(name: str, text: str, builder: Builder, result: Contribution) -> None:
    match = re.search(r"^\s*Speed:\s*(\d+)Mb/s\s*$", text, re.MULTILINE)
    base = net_dir(builder, name)
    if match and base is None:
        result.skipped.append(f"{name}: /sys/class/net/{name} is a recorded link that leads nowhere: not recorded")
    elif match and builder.put_fs(f"{base}/speed", match.group(1) + "\n", result):
        result.contributed.append(f"/sys/class/net/{name}/speed: {match.group(1)}")
    elif not match:
        result.skipped.append(f"{name}: no link speed in it (a down link has none)")
