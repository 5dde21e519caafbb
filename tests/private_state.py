"""The test session's own /var/lib/nodewarden: what the tests did, never what the machine did (issue 30.13).

The suite's guard once compared the machine's /var/lib/nodewarden before and after the run, so a
daemon of the machine's own (a shared CI host) writing its state file there failed the tests. Now,
when the session runs as root, it moves into a mount namespace of its own at start (while pytest
is still one thread) with an empty tmpfs over /var/lib/nodewarden: every process the tests start
inherits it, none of them can reach the machine's folder, and no other process on the machine
can reach the tests'. The guard then lists the private folder: exactly what the tests wrote.

Without root (no namespace), the tests cannot write the machine's root-owned folder anyway and
the guard compares listings as before. A folder the machine lacks is created for the mount and
removed again at the end, if still empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 2
MARK = "NODEWARDEN_TESTS_PRIVATE_STATE"  # set for the session's children: an inner pytest is inside already


class PrivateState:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.active = False
        self.created = False
        self.machine_fd: int | None = None  # the machine's folder, under the mount (opened before it)

    def enter(self) -> bool:
        """Into a mount namespace with an empty tmpfs over `folder`; False where that cannot be done."""
        if os.environ.get(MARK) == str(self.folder):
            self.active = True  # a pytest started by a test: already in the session's namespace
            return True
        if os.geteuid() != 0 or threading.active_count() != 1 or not self.folder.parent.is_dir():
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        if not self.folder.exists():
            try:
                self.folder.mkdir(mode=0o755)
            except OSError:
                return False
            self.created = True
        if libc.unshare(CLONE_NEWNS) != 0:
            self._remove_created()
            return False
        self.machine_fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)  # sees past the tmpfs mounted next
        # Nothing mounted here propagates back to the machine's namespace.
        if (libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0
                or libc.mount(b"tmpfs", os.fsencode(self.folder), b"tmpfs", 0, b"mode=0755") != 0):
            return False  # a namespace without the mount: the listing guard still holds
        os.environ[MARK] = str(self.folder)
        self.active = True
        return True

    def leave(self) -> None:
        """At the session's end: the folder created for the mount goes again (only if empty)."""
        if not self.created or os.environ.get(MARK) != str(self.folder):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(os.fsencode(self.folder), MNT_DETACH)
        self._remove_created()

    def _remove_created(self) -> None:
        if self.created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()
            self.created = False


def is_private_mount(folder: Path) -> bool:
    """Whether `folder` is a mount point of its own in this process's namespace (/proc/self/mountinfo)."""
    wanted = os.path.realpath(folder)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
        return any(line.split()[4] == wanted for line in info if len(line.split()) > 4)
