"""The import graph (issue 16, 1): no circles among agent/, checks/ and remediations/, and no module
imports another module's `_private` name. Read from the source with `ast`. Function-level imports
count: they are still dependencies. Imports under `if TYPE_CHECKING:` count too (issue 23): a lazy
import one way and a type-only import back is how the circles agent/apps/fleet/reading <-> render and
agent/snapshot <-> agent/sources/* hid from this test, which used to drop type-only imports.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("agent", "checks", "remediations")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "_data" in path.parts:
                continue
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _import_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, those under `if TYPE_CHECKING:` and inside functions included: all are dependencies."""
    return list(ast.walk(tree))


def _private_module_of_another_package(importer: str, module: str) -> bool:
    """`remediations._target` imported from agent/: a package's private module is its own business."""
    parts = module.split(".")
    return parts[0] != importer.partition(".")[0] and any(p.startswith("_") and not p.startswith("__") for p in parts)


def graph() -> tuple[dict[str, set[str]], list[str]]:
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, path in mods.items():
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module.split(".")[0] in PACKAGES):
                if _private_module_of_another_package(name, node.module):
                    private.append(f"{name}: from {node.module} import ...")
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in mods:
                        edges[name].add(full)
                        continue
                    edges[name].add(node.module)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{name}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods:
                        edges[name].add(alias.name)
    for name in list(edges):
        edges[name].discard(name)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    edges, _ = graph()
    assert cycles(edges) == []


def test_no_private_names_imported_across_modules() -> None:
    _, private = graph()
    assert private == []


def test_the_detector_finds_a_circle_and_a_private_import() -> None:
    # The two tests above must be able to fail: a planted circle and reach-in are found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("from agent.engine.audit import _hidden\nif TYPE_CHECKING:\n    from agent.apps.cli.main import x\n"
                     "def f():\n    from agent.sources.node import y\n")
    names = sorted(n.names[0].name for n in _import_nodes(tree) if isinstance(n, ast.ImportFrom))
    assert names == ["_hidden", "x", "y"]
    assert _private_module_of_another_package("agent.engine.remediate", "remediations._target")
    assert not _private_module_of_another_package("checks.gpu_ecc", "checks._gpu")
    assert not _private_module_of_another_package("agent.engine.remediate", "remediations.targets")


def test_every_change_type_has_one_kind() -> None:
    """Adding a Change type to remediations means adding its ChangeKind (agent.engine.change_kinds)."""
    import typing

    from agent.engine.change_kinds import KINDS
    from remediations import Change

    assert sorted(t.__name__ for t in typing.get_args(Change)) == sorted(k.change_type.__name__ for k in KINDS)
    assert len({k.name for k in KINDS}) == len(KINDS)


MAX_MODULE_LINES = 600  # issue 16, item 6: split a module along its seams before it grows past this


def long_modules(base: Path, folders: tuple[str, ...], limit: int = MAX_MODULE_LINES) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((base / folder).rglob("*.py")):
            lines = path.read_bytes().count(b"\n")
            if lines > limit:
                found.append(f"{path.relative_to(base)}: {lines} lines")
    return found


def test_no_module_over_600_lines(tmp_path: Path) -> None:
    assert long_modules(REPO, (*PACKAGES, "tests", "benchmarks", "fixtures/tools")) == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "pkg" / "fine.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(tmp_path, ("pkg",)) == [f"pkg/big.py: {MAX_MODULE_LINES + 1} lines"]
