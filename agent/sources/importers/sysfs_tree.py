"""The `sysfs-tree` kind: a copy of the kernel's `/sys` (and `/proc`) files, links and all, in a folder or archive.

`tar czf ib.tgz /sys/class/infiniband /sys/devices/pci0000:15/...` stores `sys/class/infiniband/mlx5_0`
as a link (`-> ../../devices/pci0000:15/.../infiniband/mlx5_0`) and the files at their real path; a
copy with `cp -r` or `tar -h` keeps files at the path they were read through. Both become the
snapshot's fs/ as `snapshot capture` records a live /sys: files as they are (each bounded and its
path checked by `Builder.put_fs`), links as recorded links (fs_links.json), never as OS links.

A tree is the members of one input (folder or archive) whose path in it starts `sys/` or `proc/`,
or `<one folder>/sys/...` (`./` and a leading `/`, which tar strips, make no difference). It is
only taken when it is a copy of sysfs: at least one file or link at `sys/<a top folder of
sysfs>/` (class, devices, bus, ...); a folder that merely has a `proc/` in it is detected by
content like any input. Files reach this module through the sos report importer, which waits
for every input to know which trees are sos reports (`take_trees`); `--as sysfs-tree=ARCHIVE`
hands every member of an archive here.

Links come from `agent.sources.importers.inputs` as entries holding their target's text (bounded, no
control characters). They are recorded as given, and `SnapshotFs` resolves them lexically inside
the snapshot: an absolute target starts at the snapshot's root (`/etc/passwd` is the snapshot's
fs/etc/passwd, never this machine's), `..` stops at that root; the entry says where such a
target lands. A link is not recorded where it would hide or be hidden by a file of the tree (a
file under it, or a file or link on its path), nor at a path a snapshot may not hold.

Real sysfs files read by tar: sysfs says 4096 bytes for every attribute, so tar pads what it read
with NULs (`inputs` drops the padding); procfs says 0, so tar stores an empty file: an empty
`proc/` file is not recorded (it is not the value), an empty `sys/` file is (some attributes are).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.sources.fsroot import resolve_links
from agent.sources.importers.base import LINKS_BUDGET, Builder, Contribution, InputError, valid_fs_path
from agent.sources.importers.inputs import Entry

MAX_HELD = 512 << 20  # bytes held until every input is read
MAX_HOPS = 40  # as SnapshotFs: the kernel's MAXSYMLINKS
KIND = "sysfs-tree"
_SYSFS_TOPS = frozenset({"block", "bus", "class", "dev", "devices", "firmware", "fs", "hypervisor", "kernel",
                         "module", "power"})


def lexical_target(link: str, target: str) -> tuple[str, bool]:
    """Where `target` of the link at `link` points, as SnapshotFs reads it (other links not followed):
    (the path in fs/, whether an absolute target or a `..` past the root was clamped to the snapshot)."""
    out = [] if target.startswith("/") else link.split("/")[:-1]
    clamped = target.startswith("/")
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            else:
                clamped = True
            continue
        out.append(part)
    return "/".join(out), clamped


def resolve(links: dict[str, str], path: str) -> str | None:
    """`path` with recorded links followed as SnapshotFs follows them; None for a loop."""
    try:
        return resolve_links(links, path)
    except OSError:
        return None


class Placer:
    """Puts files and links of one tree into the Builder so that none hides another.

    A file whose path crosses a file (`a` and `a/b`) or a link would be unreachable, or would
    break the writing of fs/; a link with files under it would hide them.
    """

    def __init__(self, builder: Builder) -> None:
        self.builder = builder
        self.dirs: set[str] = set(builder.fs_dirs)
        for path in [*builder.fs, *builder.links]:
            self._add_parents(path)

    def _add_parents(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts)):
            self.dirs.add("/".join(parts[:i]))

    def _crossed(self, path: str) -> str | None:
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in self.builder.fs:
                return f"/{prefix} is a file in this snapshot"
            if prefix in self.builder.links:
                return f"/{prefix} is a recorded link"
        return None

    def file(self, rel: str, data: bytes, result: Contribution) -> bool:
        if valid_fs_path(rel):
            why = self._crossed(rel) or (f"/{rel} is a folder in this snapshot" if rel in self.dirs else None)
            if why is not None:
                result.skipped.append(f"/{rel}: not recorded: {why}")
                return False
        if not self.builder.put_fs(rel, data, result):
            return False
        self._add_parents(rel)
        return True

    def link(self, rel: str, target: str, result: Contribution) -> bool:
        builder = self.builder
        if not valid_fs_path(rel):
            result.skipped.append(f"{rel[:120]!r}: a link at a path a snapshot may not hold: not recorded")
            return False
        why = self._crossed(rel)
        if why is None and rel in builder.fs:
            why = "a file of the same path is in this snapshot"
        if why is None and rel in self.dirs:
            why = "files under it are in this snapshot"
        if why is None and rel in builder.links:
            if builder.links[rel] == target:
                return True
            why = f"already recorded (to {builder.links[rel][:120]!r})"
        if why is not None:
            result.skipped.append(f"/{rel} -> {target[:120]!r}: link not recorded: {why}")
            return False
        if not builder.put_link(rel, target):
            result.skipped.append(f"/{rel}: link not recorded: fs_links.json holds at most {LINKS_BUDGET >> 20} MiB")
            return False
        self._add_parents(rel)
        where, clamped = lexical_target(rel, target)
        note = ""
        if clamped:
            note = (f" (read inside the snapshot, at /{where}: an absolute target starts at the snapshot's root, "
                    "'..' stops there)")
        result.contributed.append(f"/{rel} -> {target[:200]}: a recorded link{note}")
        return True


def take_link(entry: Entry, kind: str) -> str:
    """A link entry an importer uses: no longer refused; its target."""
    assert entry.link is not None
    entry.error, entry.kind, entry.skipped = None, kind, []
    return entry.link


def containers(entries: list[Entry]) -> list[str]:
    """The names of the folders and archives read, longest first (the innermost holds a member)."""
    found = [e.name for e in entries if e.kind == "folder" or (e.kind or "").endswith(" archive")]
    return sorted(found, key=len, reverse=True)


def tree_path(name: str, outer: list[str]) -> tuple[str, str] | None:
    """(the tree's root, the path in it: "sys/..." or "proc/...") of an entry, or None when it is in no tree."""
    for container in outer:
        prefixes = (container + ":", container.rstrip("/") + "/")
        prefix = next((p for p in prefixes if name.startswith(p) and len(name) > len(p)), None)
        if prefix is None:
            continue
        parts = [p for p in name[len(prefix):].split("/") if p]
        while parts and parts[0] == ".":
            parts.pop(0)
        if len(parts) >= 2 and parts[0] in ("sys", "proc"):
            return prefix, "/".join(parts)
        if len(parts) >= 3 and parts[1] in ("sys", "proc"):
            return f"{prefix}{parts[0]}/", "/".join(parts[1:])
        return None
    return None


def _is_sysfs(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) >= 3 and parts[0] == "sys" and parts[1] in _SYSFS_TOPS


@dataclass
class _Tree:
    root: str
    files: dict[str, tuple[Entry, bytes]] = field(default_factory=dict)
    links: dict[str, Entry] = field(default_factory=dict)

    @property
    def is_sysfs(self) -> bool:
        return any(_is_sysfs(rel) for rel in [*self.files, *self.links])


def take_trees(files: list[tuple[str, bytes]], entries: list[Entry], builder: Builder, *,
               forced: bool = False) -> set[str]:
    """Import the sysfs trees among `files` (name, content) and the link entries no importer took yet;
    the names of the files taken (the rest are the caller's). `forced`: every tree is taken (--as)."""
    by_name = {e.name: e for e in entries}
    outer = containers(entries)
    trees: dict[str, _Tree] = {}
    for name, data in files:
        where = tree_path(name, outer)
        if where is not None and name in by_name:
            trees.setdefault(where[0], _Tree(where[0])).files.setdefault(where[1], (by_name[name], data))
    for entry in entries:
        if entry.link is not None and entry.kind == "symlink":
            where = tree_path(entry.name, outer)
            if where is not None and (where[0] in trees or (not forced and _is_sysfs(where[1]))):
                trees.setdefault(where[0], _Tree(where[0])).links.setdefault(where[1], entry)
    taken: set[str] = set()
    previous = builder.current
    try:
        for tree in trees.values():
            if forced or tree.is_sysfs:
                _import_tree(tree, builder)
                taken.update(entry.name for entry, _data in tree.files.values())
    finally:
        builder.current = previous
    return taken


def _import_tree(tree: _Tree, builder: Builder) -> None:
    placer = Placer(builder)
    for rel, (entry, data) in sorted(tree.files.items()):
        builder.current = entry.name
        entry.kind = KIND
        result = Contribution()
        if not data and rel.startswith("proc/"):
            result.skipped.append(f"/{rel}: empty: procfs says 0 bytes for its files, so an archiver that trusts "
                                  "the size stores nothing (not the value): not recorded")
        elif placer.file(rel, data, result):
            result.contributed.append(f"/{rel}")
        entry.contributed += result.contributed
        entry.skipped += result.skipped
    recorded: list[tuple[str, Entry]] = []
    for rel, entry in sorted(tree.links.items()):
        builder.current = entry.name
        target = take_link(entry, KIND)
        result = Contribution()
        if placer.link(rel, target, result):
            recorded.append((rel, entry))
        entry.contributed += result.contributed
        entry.skipped += result.skipped
    for rel, entry in recorded:  # once all are recorded: a class entry whose device is not here, a loop
        if not rel.startswith("sys/class/"):
            continue
        where = resolve(builder.links, rel)
        if where is None:
            entry.skipped.append(f"/{rel}: a link loop (more than {MAX_HOPS} hops): reads of it fail")
        elif where not in builder.fs and where not in placer.dirs:
            entry.skipped.append(f"/{rel}: its target /{where} is not in this input (an archiver keeps a link, "
                                 "not what it points to: add that folder, or use `tar -h`)")


class SysfsTreeImporter:
    """`--as sysfs-tree=ARCHIVE`: every member is a file of a sysfs tree (found by itself, trees come
    through the sos report importer, which waits for every input: see `take_trees`)."""

    kind = KIND

    def __init__(self) -> None:
        self._held: list[tuple[str, bytes]] = []
        self._bytes = 0

    def detect(self, head: bytes, name: str) -> bool:
        return False  # a tree is judged whole, once every input is read (sosreport.finish -> take_trees)

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        if self._bytes + len(data) > MAX_HELD:
            raise InputError(f"not kept: more than {MAX_HELD >> 20} MiB waited for the rest of the inputs")
        self._held.append((builder.current, data))
        self._bytes += len(data)
        return Contribution()  # filled in by `finish`

    def finish(self, builder: Builder, entries: list[Entry]) -> None:
        held, self._held, self._bytes = self._held, [], 0
        if not held:
            return
        taken = take_trees(held, entries, builder, forced=True)
        by_name = {e.name: e for e in entries}
        for name, _data in held:
            if name not in taken and name in by_name:
                by_name[name].error = ("not a file of a sysfs tree (sys/... or proc/..., at the top of the "
                                       "archive or in one folder): not imported")
