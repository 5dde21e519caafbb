"""The one-shot audit's short cuts (issue 16, Figure 1) keep what they replace: the console script's exit
without teardown, the collector threshold, the lazily defined commands, Fabric Manager time stamps read
without strptime, check discovery without pkgutil."""

from __future__ import annotations

import datetime as dt
import gc
import itertools
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import checks
from agent.sources.fabric import fm_log_time
from tests.conftest import REPO

AUDIT = ["audit", "--simulate", "hgx-h100-drifted", "--format", "json"]

_MAIN = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", file=sys.stderr, flush=True))
if "--with-thread" in sys.argv:
    sys.argv.remove("--with-thread")
    def late():
        time.sleep(0.3)
        print("thread done", file=sys.stderr, flush=True)
    threading.Thread(target=late).start()
from agent.apps.cli.main import main
sys.argv[0] = "nodewarden"
main()
print("not reached", file=sys.stderr)
"""


def run_main(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NODEWARDEN_NO_CACHE", None)
    return subprocess.run([sys.executable, "-c", _MAIN, *args], capture_output=True, text=True, cwd="/",
                          env=env, timeout=120, check=False)


def test_the_console_script_exits_with_its_code_output_and_atexit_handlers(tmp_path: Path) -> None:
    done = run_main(AUDIT, tmp_path)
    assert done.returncode == 1, done.stderr  # the drifted node fails checks
    report = json.loads(done.stdout)  # all of it: the buffered output was flushed
    assert report["profile"] == "hgx-h100-sxm" and report["summary"]["fail"] > 0
    assert done.stderr.splitlines() == ["atexit ran"]
    version = run_main(["--version"], tmp_path)
    assert (version.returncode, version.stdout, version.stderr) == (0, "nodewarden, version 0.1.0\n", "atexit ran\n")
    usage = run_main(["audit", "--bogus"], tmp_path)
    assert usage.returncode == 2 and "No such option" in usage.stderr and usage.stderr.endswith("atexit ran\n")


def test_the_console_script_waits_for_a_thread_as_the_interpreter_does(tmp_path: Path) -> None:
    done = run_main(["--with-thread", "--version"], tmp_path)
    assert done.returncode == 0
    assert done.stderr.splitlines() == ["thread done", "atexit ran"]


def test_an_audit_collects_less_often_and_restores_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.engine.audit
    from agent.apps.cli.main import cli

    seen: list[tuple[int, ...]] = []
    real = agent.engine.audit.run_audit

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(agent.engine.audit, "run_audit", spy)
    before = gc.get_threshold()
    result = CliRunner().invoke(cli, AUDIT)
    assert result.exit_code == 1 and seen == [(50_000, *before[1:])]
    assert gc.get_threshold() == before


def test_commands_are_imported_when_named_and_read_as_before() -> None:
    code = ("import sys\nfrom agent.apps.cli.main import cli\n"
            "print(sorted(m for m in ('agent.apps.cli.commands', 'agent.apps.cli.baseline') if m in sys.modules))\n"
            "cli.commands['profiles']\nprint(sorted(m for m in ('agent.apps.cli.commands', 'agent.apps.cli.baseline') "
            "if m in sys.modules))\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                           timeout=60).stdout.splitlines()
    assert lines == ["[]", "['agent.apps.cli.commands']"]
    from agent.apps.cli.main import cli

    names = cli.list_commands(None)  # type: ignore[arg-type]
    assert {"audit", "baseline", "daemon", "fleet", "profiles", "remediate", "snapshot", "apply-boot"} <= set(names)
    result = CliRunner().invoke(cli, ["profiles", "list", "-v"])
    assert result.exit_code == 0 and "hgx-h100-sxm" in result.output
    match = cli.commands["profiles"].commands["match"]  # type: ignore[attr-defined]
    assert {"--log-format", "--simulate"} <= {o for p in match.params for o in getattr(p, "opts", ())}


MONTHS = ["Jan", "Feb", "Dec", "JAN", "jan", "Foo", "Sept"]
DAYS = ["0", "00", "1", "01", "9", "29", "30", "31", "32", "123", "\u0663"]
YEARS = ["2024", "0000", "0001", "9999", "202", "20245", "2023"]
CLOCKS = ["00:00:00", "23:59:59", "24:00:00", "7:5:3", "18:60:00", "18:14:60", "18:14:61", "1:2", "18:14:07:1",
          "\u0661\u0668:14:07", "18:14:0x"]


def strptime_or_none(when: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(when, "%b %d %Y %H:%M:%S")
    except ValueError:
        return None


def test_fabric_manager_time_stamps_read_as_strptime_reads_them() -> None:
    stamps = [" ".join(parts) for parts in itertools.product(MONTHS, DAYS, YEARS, CLOCKS)]
    stamps += [" Jul 09 2024 18:14:07", "Jul  9 2024 18:14:07", "Jul 09 2024", "Jul 09 2024 18:14:07 ",
               "Jul\t09 2024 18:14:07", "Feb 29 2024 00:00:00", "Feb 29 2023 00:00:00"]
    assert [fm_log_time(s) for s in stamps] == [strptime_or_none(s) for s in stamps]
    assert fm_log_time("Jul 09 2024 18:14:07") == dt.datetime(2024, 7, 9, 18, 14, 7)
    assert fm_log_time(None) is None and fm_log_time("") is None


def test_check_modules_are_found_as_pkgutil_finds_them(tmp_path: Path) -> None:
    assert checks._module_names(checks.__path__) == [m.name for m in pkgutil.iter_modules(checks.__path__)]
    for name in ("a.py", "b.cpython-311-x86_64-linux-gnu.so", "c.pyc", "d.txt", "__init__.py", "e.py", "e.pyc"):
        (tmp_path / name).write_text("")
    for folder, files in (("pkg", ["__init__.py"]), ("pkg2", ["__init__.pyc"]), ("plain", ["x.py"]),
                          ("dot.ted", ["__init__.py"])):
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text("")
    folders = [str(tmp_path), str(tmp_path), str(tmp_path / "absent")]
    assert checks._module_names(folders) == [m.name for m in pkgutil.iter_modules(folders)]


def test_a_simulated_audit_imports_no_thread_pool_strptime_pkgutil_or_other_commands(tmp_path: Path) -> None:
    from tests.unit.engine.test_startup_imports import run_fresh

    run_fresh(AUDIT, tmp_path)  # warm caches, as on a node
    code, modules = run_fresh(AUDIT, tmp_path)
    assert code == 1 and "checks.gpu_thermal" in modules
    unneeded = ("concurrent.futures", "queue", "_strptime", "pkgutil", "agent.apps.cli.commands", "agent.apps.cli.baseline")
    assert [m for m in unneeded if m in modules] == []


def test_a_command_imported_when_named_is_one_of_the_group_before_that() -> None:
    """`"baseline" in cli.commands` is true before agent.apps.cli.baseline is imported (a test that asked this
    of a plain dict built its own root, and the man page then lost `-h`)."""
    code = ("import sys; from agent.apps.cli.main import cli; "
            "print('baseline' in cli.commands, 'agent.apps.cli.baseline' in sys.modules, 'nope' in cli.commands)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                          timeout=60)
    assert done.stdout.split() == ["True", "False", "False"]
