"""Issue 30.6: every program nodewarden runs as root (scontrol/sinfo: tests/integration/test_scheduler_slurm.py; an
accept load command: here) is held to the profiles' trust rule, and refused by name with the reason."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import cast

import pytest

from agent.apps.accept.runners import CommandLoad, LoadError
from agent.io.trusted_exec import UntrustedProgram, find_program, trusted_program


def program(folder: Path, mode: int = 0o755) -> Path:
    folder.mkdir(exist_ok=True)
    folder.chmod(mode)
    path = folder / "burn"
    path.write_text(f"#!/bin/sh\n/usr/bin/touch {folder.parent / 'ran'}\n")
    path.chmod(0o755)
    return path


def test_a_load_command_in_a_folder_anyone_can_write_never_runs(tmp_path: Path) -> None:
    burn = program(tmp_path / "open", 0o777)
    load = CommandLoad([str(burn), "600"])
    with pytest.raises(LoadError, match=r"load could not start: .*unsafe load command: .*/open is writable by "
                                        r"group and others \(mode 0777\)"):
        load.start()
    assert load.proc is None and not (tmp_path / "ran").exists()


def test_a_load_command_owned_by_another_user_never_runs(tmp_path: Path) -> None:
    burn = program(tmp_path / "bin")
    os.chown(burn, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(LoadError, match=r"burn is owned by uid \d+, not root or the user running nodewarden "
                                        r"\(another user could choose what nodewarden runs as root\)"):
        CommandLoad([str(burn)]).start()
    assert not (tmp_path / "ran").exists()


def test_a_trusted_load_command_runs_by_name_from_path(tmp_path: Path) -> None:
    burn = program(tmp_path / "bin")
    load = CommandLoad(["burn"], env={"PATH": f"relative:{burn.parent}"})  # a relative entry is never searched
    load.start()
    assert load.proc is not None  # the guard (agent.apps.accept.load_guard) runs it by its checked path
    args = cast(list[str], load.proc.args)
    assert args[args.index("--") + 1] == str(burn)
    load.proc.wait(timeout=10)
    assert (tmp_path / "ran").exists()
    load.stop()


def test_a_planted_copy_is_refused_not_skipped(tmp_path: Path) -> None:
    """The first folder holding the name decides: a planted copy is reported, never shadowed by the next."""
    program(tmp_path / "open", 0o777)
    good = program(tmp_path / "good")
    with pytest.raises(UntrustedProgram, match="unsafe burn"):
        find_program("burn", [tmp_path / "open", good.parent])
    assert find_program("burn", [tmp_path / "missing", good.parent]) == str(good)
    with pytest.raises(UntrustedProgram, match=r"burn not found in .*missing"):
        find_program("burn", [tmp_path / "missing"])


def test_a_symlink_is_judged_by_where_it_leads(tmp_path: Path) -> None:
    burn = program(tmp_path / "open", 0o777)
    safe = tmp_path / "safe"
    safe.mkdir()
    (safe / "burn").symlink_to(burn)
    with pytest.raises(UntrustedProgram, match="writable by group and others"):
        trusted_program(safe / "burn", "load command")
    shutil.move(burn, safe / "real")
    (safe / "burn").unlink()
    (safe / "burn").symlink_to(safe / "real")
    assert trusted_program(safe / "burn") == str(safe / "real")
