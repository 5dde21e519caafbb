"""The daemon's own state folder, STATE_DIR/daemon, and the one rule root reads it by (issue 30.10).

The shipped unit runs the daemon as a dynamic user under ProtectSystem=strict, with
`StateDirectory=nodewarden/daemon`: systemd makes /var/lib/private/nodewarden/daemon owned by that
user (below root's 0700 /var/lib/private) and the root-owned symlink /var/lib/nodewarden/daemon to it.
Root's health-check must read daemon.json from a folder it does not own, so it accepts exactly that
layout and nothing else:

* the entry STATE_DIR/daemon sits in root's trusted state dir; if it is a symlink, it is root's;
* every folder above the real folder is root's (or ours) and writable by nobody else, up to a
  root-owned one: only root can have made the folder or chosen its owner;
* the folder itself is writable by its owner only (the owner is whoever root gave it to);
* the file is a regular file, owned by that same owner (or root), writable by nobody else, one
  link only; it is opened beneath the held folder without following a link and judged by its
  descriptor, so what was checked is what is parsed.

A file of any other uid, or a folder elsewhere or of another shape, is refused by name.
Without STATE_DIR/daemon (a daemon run as root, the tests) daemon.json stays in STATE_DIR/scheduler
under the state dir's usual rule (agent.io.fsutil.trusted_dir).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.io.fsutil import FileSafetyError, trusted_dir
from agent.io.jsonfile import read_fd
from agent.io.trusted_input import check_folders

DAEMON_DIR = "daemon"
_WRITABLE = stat.S_IWGRP | stat.S_IWOTH
_WHAT = "daemon state folder"


def has_daemon_dir(state_dir: Path) -> bool:
    """Whether systemd (StateDirectory=) or the admin gave the daemon its own folder here."""
    return os.path.lexists(state_dir / DAEMON_DIR)


def _refuse(why: str, path: Path) -> FileSafetyError:
    return FileSafetyError(f"unsafe {_WHAT}: {why}", path=str(path))


def _real_folder(state_dir: Path) -> str:
    entry = trusted_dir(state_dir) / DAEMON_DIR
    st = os.lstat(entry)
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
        raise _refuse(f"the symlink {entry} is owned by uid {st.st_uid}, not root", entry)
    # The entry is in a folder only root can change, so root chose where it leads; what is judged
    # below is the real folder's place (its parents) and shape, not the way there.
    real = os.path.realpath(entry)
    check_folders(os.path.dirname(real), _WHAT, FileSafetyError, str(entry))
    return real


def read_daemon_file(state_dir: Path, name: str, max_bytes: int) -> bytes:
    """At most `max_bytes + 1` bytes of STATE_DIR/daemon/`name`, if folder and file keep the rule above.

    FileNotFoundError when there is no such file (no daemon writes here); FileSafetyError otherwise.
    """
    real = _real_folder(state_dir)
    shown = Path(real) / name
    dir_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        folder = os.fstat(dir_fd)
        if folder.st_mode & _WRITABLE:
            raise _refuse(f"{real} is writable by others than its owner (mode {stat.S_IMODE(folder.st_mode):04o})",
                          shown)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(f"{shown} is not a regular file", shown)
        if st.st_uid not in (folder.st_uid, 0):
            raise _refuse(f"{shown} is owned by uid {st.st_uid}, not by the folder's owner (uid {folder.st_uid}) "
                          "or root", shown)
        if st.st_mode & _WRITABLE:
            raise _refuse(f"{shown} is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o})", shown)
        if st.st_nlink != 1:  # a hard link to someone else's file is not the daemon's word
            raise _refuse(f"{shown} has {st.st_nlink} links", shown)
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)
