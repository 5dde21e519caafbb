"""What a one-shot command imports (issue 16): pinned by module name, not by timing.

`nodewarden audit --simulate hgx-h100-drifted --format json` reads a recorded node: no live NVML, BMC
or IPMI, no metrics server, no file written. Each library below costs milliseconds to import (pynvml
with ctypes.util ~15 ms, hashlib's OpenSSL ~3 ms, statistics with fractions and decimal ~4 ms), so
the audit must not import it at all; benchmarks/bench_startup.py times what is left (Figure 1). Each
command runs in a fresh interpreter, since this test process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# Libraries of sources this audit does not read live, and of commands it is not.
SOURCE_LIBRARIES = ("pynvml", "redfish", "requests", "urllib3", "pyghmi", "prometheus_client", "psutil")
# Standard-library modules only some paths need: writing a file (secrets, socket), the OpenSSL
# hashes (hashlib; SHA-256 comes from agent.core.digest), a median of GPU temperatures (statistics),
# and HTTP or TLS, which only a live BMC read uses.
STDLIB_EXTRAS = ("hashlib", "secrets", "socket", "statistics", "ssl", "http.client", "email")

_RUN = """
import sys
from agent.apps.cli.main import cli
try:
    cli.main(args=sys.argv[1:], prog_name="nodewarden")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
modules = sorted(sys.modules)  # before this harness imports json
import json
print(json.dumps({"code": code, "modules": modules}), file=sys.stderr)
"""


def run_fresh(args: list[str], cache: Path) -> tuple[int, set[str]]:
    """`nodewarden ARGS` in a new interpreter: its exit code and every module it had imported at the end."""
    env = {k: v for k, v in os.environ.items() if k not in ("CACHE_DIRECTORY", "NODEWARDEN_NO_CACHE")}
    env["XDG_CACHE_HOME"] = str(cache)  # the YAML cache: warm after the first run, as on a node
    done = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=60, check=False)
    last = done.stderr.strip().splitlines()[-1]
    result = json.loads(last)
    return int(result["code"]), set(result["modules"])


def test_a_simulated_audit_imports_no_library_of_a_source_it_does_not_read(tmp_path: Path) -> None:
    args = ["audit", "--simulate", "hgx-h100-drifted", "--format", "json"]
    run_fresh(args, tmp_path)  # fills the YAML cache, so the audit below is a warm one
    code, modules = run_fresh(args, tmp_path)
    assert code == 1, "the drifted node's audit fails checks (exit 1): it ran to the end"
    assert "agent.engine.audit" in modules and "checks.gpu_thermal" in modules  # the audit really ran, GPU checks too
    assert [m for m in modules if m.split(".")[0] in SOURCE_LIBRARIES] == []
    assert [m for m in modules if m in STDLIB_EXTRAS] == []
    assert "yaml" not in modules, "every profile was parsed before: the audit reads them from the cache"


def test_version_imports_no_audit_machinery(tmp_path: Path) -> None:
    code, modules = run_fresh(["--version"], tmp_path)
    assert code == 0
    heavy = ("agent.engine.audit", "agent.core.facts", "checks", "logging", "traceback", "json", "yaml", *SOURCE_LIBRARIES)
    assert [m for m in modules if m in heavy] == []
