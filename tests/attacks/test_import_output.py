"""What `snapshot import` prints about hostile inputs (issue 26.5): a file name that carries terminal escapes
is printed escaped, in the summary, with -v and with -q."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO, RunCli


def test_hostile_names_never_reach_the_terminal_raw(tmp_path: Path, run_cli: RunCli) -> None:
    given = tmp_path / "in"
    shutil.copytree(REPO / "fixtures" / "redfish" / "hpe-dl380a-gen11" / "redfish", given / "redfish")
    (given / "a\x1b[31mred\x07.bin").write_bytes(b"\x00\x01 binary")
    (given / "redfish" / "v1" / "b\x1b]0;title\x07.json").write_text('{"@odata.id": 7}')
    for flags in ((), ("-v",), ("-q",)):
        result = run_cli("snapshot", "import", *flags, str(given), "--out", str(tmp_path / f"out{len(flags)}{flags}"))
        assert result.code == 0, result.stderr
        shown = result.stdout + result.stderr
        assert "\x1b" not in shown and "\x07" not in shown, (flags, shown[-500:])
        assert "red" in result.stderr or flags == ("-q",)  # still named, escaped
        assert "title" in result.stderr  # the error is named with every flag
