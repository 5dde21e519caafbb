"""Bytes that are not UTF-8 where nodewarden expects text (issue 21, item 10): shown escaped, never a crash.

A recording (or a kernel attribute) holding a stray byte must give a clear plan, not "internal
error" (exit 3). apply-boot's case lives with its other tests in tests/unit/engine/test_boot_apply.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import RunCli

RMEM = "fs/proc/sys/net/core/rmem_max"


def test_a_sysctl_value_that_is_not_utf8_is_planned_escaped(run_cli: RunCli, drifted_copy: Path,
                                                            empty_config: Path) -> None:
    value = drifted_copy / RMEM
    value.unlink()  # a hard-linked copy: replace, never write through
    value.write_bytes(b"42\xff\xfe\n")
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--config", str(empty_config),
                     "--format", "json")
    assert result.code in (0, 1), result.stderr  # a plan, never "internal error" (3)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    (action,) = [a for a in json.loads(result.stdout)["actions"] if a["id"] == "sysctl:net.core.rmem_max"]
    assert action["before"] == "42\\xff\\xfe"  # escaped, so a human sees what is there
    assert action["status"] == "planned" and action["after"] != action["before"]
    assert value.read_bytes() == b"42\xff\xfe\n"  # a plan writes nothing
