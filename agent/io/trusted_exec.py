"""Programs nodewarden runs as root are trusted input: scontrol and sinfo, a load command named in
the config or on the command line, any tool looked up in a folder.

Whoever can change such a program runs code as root, so it is run only under the rule profiles and
waivers are read by (agent.io.trusted_input): a regular, executable file owned by root or the running
user and writable by nobody else, in a folder nobody else can write, and so on up to the first
root-owned folder nobody else can write; each symlink on the way root's or ours. What was checked
is the real path (symlinks resolved), and that is what is run, so a link swapped later changes
nothing: nobody else can change the folders it sits in. A refusal names the program and says why.

Floor 2: imports agent.core.errors and agent.io.trusted_input only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from agent.core.errors import NodewardenError
from agent.io.trusted_input import check_folders, judge_file, real_path


class UntrustedProgram(NodewardenError):
    """A program nodewarden would run as root that others could have changed (or that is not there)."""


def trusted_program(path: str | os.PathLike[str], what: str = "program") -> str:
    """The real path of `path` to run, if it and its folders pass the rule above; UntrustedProgram if not."""
    return _trusted(path, what, executable=True)


def trusted_source(path: str | os.PathLike[str], what: str = "source") -> str:
    """The same rule for a file a trusted interpreter runs (a script named by path): its real path."""
    return _trusted(path, what, executable=False)


def _trusted(path: str | os.PathLike[str], what: str, *, executable: bool) -> str:
    named = os.fspath(path)
    if not os.path.isabs(named):
        raise UntrustedProgram(f"refusing to run {what} {named!r}: not an absolute path", path=named)
    real = real_path(os.path.abspath(named), what, UntrustedProgram)
    try:
        st = os.stat(real, follow_symlinks=False)
    except OSError as exc:
        raise UntrustedProgram(str(exc.strerror), path=named) from None  # "PATH: No such file or directory"
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedProgram(f"refusing to run {what}: {real} is not a regular file", path=named)
    if executable and not st.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
        raise UntrustedProgram(f"refusing to run {what}: {real} is not executable", path=named)
    try:
        judge_file(st, real, what, UntrustedProgram, named)
        check_folders(os.path.dirname(real), what, UntrustedProgram, named)
    except UntrustedProgram as exc:  # the shared rule's words are about files read: this one is run
        raise UntrustedProgram(exc.message.replace("nodewarden writes as root", "nodewarden runs as root"),
                               path=named) from None
    return real


def find_program(name: str, folders: Iterable[str | os.PathLike[str]], what: str | None = None) -> str:
    """The first `folders/name` that exists, checked by trusted_program. A found program that fails the
    rule is refused, never skipped for the next folder: a planted copy must be seen, not shadowed."""
    what = what or name
    tried = []
    for folder in folders:
        candidate = Path(folder) / name
        tried.append(str(folder))
        if os.path.lexists(candidate):
            return trusted_program(candidate, what)
    raise UntrustedProgram(f"{name} not found in {', '.join(tried) or 'no folder'}")


def resolve_command(argv0: str, search: Iterable[str | os.PathLike[str]], what: str) -> str:
    """A command's first word as a trusted absolute path: itself when it names a path, else looked up
    in `search` (never the caller's PATH: root's PATH may name anything)."""
    if "/" in argv0:
        return trusted_program(os.path.abspath(argv0), what)
    return find_program(argv0, search, what)
