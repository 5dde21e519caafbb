"""Issue 26.12: what README.md says about deployment and monitoring is true.

* the series per node it quotes (and docs/metrics.md and figure 9 of benchmarks/README.md) are what
  `benchmarks/bench_series.py` measures now, with the benchmark's own code: a change in the exporter
  that adds or removes series makes this fail until the numbers are re-measured and updated;
* the alerts per drifted node it quotes are the ones tests/integration/test_alerting.py sees fire on the
  drifted node's real metrics, and the ceiling the rules file quotes is the one that test enforces;
* the manual install recipe names only files the repository ships, and the example config it
  installs is the one `nodewarden install` writes.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO
from tests.integration.test_alerting import DRIFTED_ALERTS, MAX_ALERTS_PER_NODE
from tests.integration.test_monitoring import METRICS_DOC, RULES

README = REPO / "README.md"
BENCHMARKS_README = REPO / "benchmarks" / "README.md"
EXAMPLE_CONFIG = REPO / "systemd" / "config.example.yaml"
NODES = ("hgx-h100-drifted", "hgx-h100-healthy")


def flat(path: Path) -> str:
    """The file's text with every run of whitespace (line breaks included) as one space."""
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def bench_series() -> ModuleType:
    """benchmarks/bench_series.py itself, so that the test counts exactly as the benchmark does."""
    bench_dir = str(REPO / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)  # it imports its sibling `_timing`
    spec = importlib.util.spec_from_file_location("bench_series", REPO / "benchmarks" / "bench_series.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[int, int]]:
    """node -> (series in its audit's textfile exposition, series in one scrape of its daemon)."""
    bench = bench_series()
    return {node: (sum(bench.series(bench.audit_text(node)).values()), sum(bench.series(bench.daemon_text(node)).values()))
            for node in NODES}


def test_quoted_series_per_node_are_the_benchmarks(measured: dict[str, tuple[int, int]]) -> None:
    (d_audit, d_daemon), (h_audit, h_daemon) = measured["hgx-h100-drifted"], measured["hgx-h100-healthy"]
    quotes = {
        README: [f"({d_daemon} series per scrape for the simulated drifted 8-GPU node, {h_daemon} for the healthy one",
                 f"({d_audit} series for the drifted node, {h_audit} for the healthy one)"],
        METRICS_DOC: [f"the simulated drifted 8-GPU node exports {d_audit} series in its audit and {d_daemon} on the "
                      f"daemon's /metrics, the healthy one {h_audit} and {h_daemon}"],
        BENCHMARKS_README: [f"| drifted | **{d_audit}** | **{d_daemon}** |", f"| healthy | **{h_audit}** | **{h_daemon}** |"],
    }
    stale = [f"{path.relative_to(REPO)}: {quote!r}" for path, texts in quotes.items() for quote in texts
             if quote not in flat(path)]
    assert not stale, ("quoted series counts differ from what benchmarks/bench_series.py measures now "
                       f"(drifted {d_audit}/{d_daemon}, healthy {h_audit}/{h_daemon}); missing:\n" + "\n".join(stale))


def test_quoted_alerts_per_drifted_node_are_the_alerting_tests() -> None:
    readme = flat(README)
    assert f"(the simulated drifted node: {len(DRIFTED_ALERTS)}, counted by a test on its real metrics)" in readme
    for name, _severity in DRIFTED_ALERTS:
        assert f"`{name}`" in readme, f"README does not name {name}, which fires on the drifted node"
    assert f"at most {MAX_ALERTS_PER_NODE})" in flat(RULES)


def recipe_paths(text: str) -> list[str]:
    """Repository files the README's `install` commands copy (arguments that are relative paths)."""
    paths: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for command in re.split(r"&&|\n(?![ \t])", block.replace("\\\n", " ")):
            words = shlex.split(command.split("<<<")[0], comments=True)
            if not words or words[0] != "install":
                continue
            args = [w for w in words[1:] if not w.startswith("-")]
            # `install -m MODE -o USER -g GROUP SRC... DEST`: option values are not files.
            values = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-m", "-o", "-g")}
            paths += [a for a in args[:-1] if a not in values and not a.startswith("/")]
    return paths


def test_recipe_parser_finds_the_files() -> None:
    text = ("```bash\ninstall -m 0644 systemd/a.service systemd/b.timer \\\n    /etc/systemd/system/\n"
            "install -d -m 0755 /etc/x && install -m 0644 config.yaml /etc/x/config.yaml\n"
            "install -m 0600 -o root -g root /dev/stdin /etc/x/pw <<< 'secret'\n```\n")
    assert recipe_paths(text) == ["systemd/a.service", "systemd/b.timer", "config.yaml"]


def test_install_recipe_names_only_shipped_files() -> None:
    paths = recipe_paths(README.read_text(encoding="utf-8"))
    assert "systemd/nodewarden.service" in paths and "systemd/config.example.yaml" in paths
    missing = [path for path in paths if not (REPO / path).is_file()]
    assert not missing, f"README's install commands name files the repository does not ship: {missing}"


def test_shipped_example_config_is_what_install_writes() -> None:
    from agent.policy.config_doc import example_config

    assert EXAMPLE_CONFIG.read_text(encoding="utf-8") == example_config(), (
        "systemd/config.example.yaml is stale: run `python -c 'from agent.policy.config_doc import example_config; "
        "print(example_config(), end=\"\")' > systemd/config.example.yaml`")
