"""The floors of agent/ (issue 32.2; docs/architecture.md states the same map): each folder imports only its
own floor and the floors below, siblings joined by `|` never import each other, `core` needs nothing but the
standard library, and nothing imports `agent.apps` but its CLI. The import graph is tests/test_architecture.py's
(function-level and TYPE_CHECKING imports count).

    core -> io -> policy | state -> sources | report -> checks -> remediations -> engine -> apps
"""

from __future__ import annotations

import ast
import sys

from tests.conftest import REPO
from tests.test_architecture import graph, modules

# Bottom up. A floor may import any floor with a lower number; those with the same number are siblings.
FLOORS: dict[str, int] = {
    "agent.core": 0,
    "agent.io": 1,
    "agent.policy": 2, "agent.state": 2,
    "agent.sources": 3, "agent.report": 3,
    "checks": 4,
    "remediations": 5,
    "agent.engine": 6,
    "agent.apps": 7,
}
ROOT_ENTRIES = {"__init__.py", "__main__.py", "__pycache__", *(f.split(".")[1] for f in FLOORS if f.startswith("agent."))}
CLI = "agent.apps.cli"
# Edges that break the map, each with what removes it (issue 32): none left; none may be added.
KNOWN: dict[tuple[str, str], str] = {}


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "agent":
        return parts[0] if parts[0] in FLOORS else None
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in FLOORS else None


def app_of(module: str) -> str | None:
    """`agent.apps.fleet.render` -> `agent.apps.fleet` (each app is a room of its own)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 2 and parts[1] == "apps" else None


def violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for importer, imported in sorted((a, b) for a, targets in edges.items() for b in targets):
        low, high = floor_of(importer), floor_of(imported)
        if low is None or high is None or (importer, imported) in KNOWN:
            continue  # agent/__main__ and agent/__init__ (the version) belong to no floor
        if low == high:
            room, other = app_of(importer), app_of(imported)
            if low == "agent.apps" and room not in (other, CLI) and other is not None:
                found.append(f"{importer} -> {imported}: one app imports another (only {CLI} wires them)")
        elif FLOORS[high] == FLOORS[low]:
            found.append(f"{importer} -> {imported}: siblings ({low} | {high}) never import each other")
        elif FLOORS[high] > FLOORS[low]:
            found.append(f"{importer} -> {imported}: upward ({low} is below {high})")
    return found


def test_imports_point_down_the_floors() -> None:
    edges, _ = graph()
    assert violations(edges) == []
    used = {(a, b) for a, targets in edges.items() for b in targets}
    assert set(KNOWN) <= used, "a known exception that no longer exists: remove it"


def test_the_map_catches_an_upward_a_sibling_and_an_app_import() -> None:
    planted = {"agent.core.model": {"agent.io.fsutil"}, "agent.policy.config": {"agent.state.journal"},
               "agent.apps.accept.html": {"agent.apps.fleet.render"}, "agent.apps.cli.main": {"agent.apps.fleet.x"},
               "checks.gpu_ecc": {"agent.core.model", "remediations.sysctl"}, "agent.engine.audit": {"checks"}}
    assert violations(planted) == [
        "agent.apps.accept.html -> agent.apps.fleet.render: one app imports another (only agent.apps.cli wires them)",
        "agent.core.model -> agent.io.fsutil: upward (agent.core is below agent.io)",
        "agent.policy.config -> agent.state.journal: siblings (agent.policy | agent.state) never import each other",
        "checks.gpu_ecc -> remediations.sysctl: upward (checks is below remediations)",
    ]


def test_agent_holds_the_floors_and_nothing_else() -> None:
    entries = {p.name for p in (REPO / "agent").iterdir()}
    assert entries - {"_data", "__pycache__"} == ROOT_ENTRIES - {"__pycache__"}  # _data: the wheel's, not a checkout's
    assert len(ROOT_ENTRIES - {"__pycache__"}) <= 10
    assert all(floor_of(name) for name in modules() if name.count(".") >= 1 and name.split(".")[1] not in (
        "__main__",)), "a module outside every floor"


def test_core_needs_only_the_standard_library() -> None:
    # _sha2 / _sha256: CPython's own hash modules (agent.core.digest), shipped with every interpreter
    allowed = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | {"agent", "_sha2", "_sha256"}
    outside = []
    for name, path in sorted(modules().items()):
        if not name.startswith("agent.core"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            outside += [f"{name}: {m}" for m in imported if m.split(".")[0] not in allowed]
    assert outside == []


def test_the_config_keys_of_the_polls_are_the_sources_polls() -> None:
    """The daemon's polls are policy (agent.policy.polls: the config keys and defaults); the sources name them."""
    from agent.policy.polls import POLLS
    from agent.sources.registry import polls

    assert polls() == POLLS


def test_checks_judge_facts_and_never_parse_records() -> None:
    """Issue 32.4: records are parsed before facts (agent.sources.kernel_log for the kernel log); a check
    imports no parser of a source's records."""
    found = []
    for name, path in sorted(modules().items()):
        if not name.startswith("checks"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent.sources"):
                found += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("parse_")]
    assert found == []


# Calls that start a program (or a shell). Type names such as subprocess.Popen in annotations are no call.
STARTS_A_PROGRAM = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
           "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
           "spawnl", "spawnle", "spawnlp", "spawnlpe"},
}
# The one helper, and the load's guard: it runs isolated (`python -I`, standard library only) and cannot
# import the helper. agent.apps.scheduler.oneshot forks a worker of our own through multiprocessing: not a
# program, and not a call on this list.
RUNS_PROGRAMS = {"agent.io.programs", "agent.apps.accept.load_guard"}


def program_starts(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.attr in STARTS_A_PROGRAM.get(func.value.id, set())):
            found.append(f"{func.value.id}.{func.attr} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom) and node.module in STARTS_A_PROGRAM:
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name in STARTS_A_PROGRAM[node.module]]
    return found


def test_every_program_is_run_through_the_one_bounded_helper() -> None:
    """Issue 32.6: Slurm, the IPMI reader, accept's loads and probe, the event gate: all through
    agent.io.programs (argv only, a session of its own, bounded in time and output)."""
    found = []
    for name, path in sorted(modules().items()):
        if name not in RUNS_PROGRAMS:
            found += [f"{name}: {call}" for call in program_starts(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def test_the_program_rule_sees_a_direct_start() -> None:
    planted = "import os, subprocess\nfrom subprocess import check_output\nsubprocess.run(['x'])\nos.system('x')\n"
    assert program_starts(ast.parse(planted)) == [
        "from subprocess import check_output", "subprocess.run (line 3)", "os.system (line 4)"]
    assert program_starts(ast.parse("import subprocess\np: subprocess.Popen[bytes] | None = None\n")) == []
