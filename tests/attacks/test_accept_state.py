"""Acceptance state and loads as hostile input: a planted or crafted baseline, a symlink planted where
last.json goes, a state folder others can write, and a load that floods its output without newlines.
Each is refused or bounded, and a run still ends with a result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.apps.accept.runners import TAIL_LINE_CHARS, CommandLoad
from agent.core.series import MAX_GPUS, SCHEMA
from agent.io.fsutil import FileSafetyError
from agent.state.acceptance import MAX_RECORDING_BYTES, AcceptStore

GOOD_GPU: dict[str, Any] = {"uuid": "GPU-1", "index": 0, "series": {"t": [0.0], "power_w": [600.0]}}


def _store(tmp_path: Path) -> AcceptStore:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "accept").mkdir(mode=0o700)
    return AcceptStore(state)


@pytest.mark.parametrize(("content", "why"), [
    (b"{not json", "unreadable: "),
    (b"[" * 100 + b"]" * 100, "nested deeper than 8 levels"),
    (json.dumps({"schema": "nodewarden.report/v1"}).encode(), "ignored: not a nodewarden.accept/v1 recording"),
    (json.dumps({"schema": SCHEMA, "gpus": [GOOD_GPU] * (MAX_GPUS + 1)}).encode(), f"at most {MAX_GPUS}"),
    (json.dumps({"schema": SCHEMA, "gpus": [{**GOOD_GPU, "series": {"t": ["600"]}}]}).encode(), "expected a number"),
    (b'{"schema": "%s", "gpus": [{"uuid": "G", "index": 0, "series": {"temp_c": [NaN]}}]}' % SCHEMA.encode(),
     "expected a number"),
    (json.dumps({"schema": SCHEMA, "gpus": [{"uuid": 7, "index": 0, "series": {}}]}).encode(), "without uuid"),
    (b" " * (MAX_RECORDING_BYTES + 1), "larger than"),
])
def test_a_crafted_baseline_is_ignored_with_the_reason(tmp_path: Path, content: bytes, why: str) -> None:
    store = _store(tmp_path)
    (tmp_path / "state" / "accept" / "baseline.json").write_bytes(content)
    baseline, reason = store.baseline()
    assert baseline is None
    assert reason is not None and why in reason


def test_a_symlink_planted_as_last_json_is_replaced_not_followed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    last = tmp_path / "state" / "accept" / "last.json"
    last.symlink_to(victim)
    store.save_last({"passed": True, "finished_at": "2026-12-03T00:00:00+00:00", "baseline": None})
    assert victim.read_text() == "keep me\n"
    assert not last.is_symlink() and json.loads(last.read_text())["passed"] is True


def test_a_state_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)  # noqa: S103 - the hostile setup under test
    with pytest.raises(FileSafetyError, match="writable"):
        AcceptStore(state).save_last({"passed": False})
    assert not (state / "accept").exists()


def test_a_load_flooding_output_without_newlines_is_bounded(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    flood = "import sys; sys.stdout.write('x' * 3_000_000 + 'tail words'); sys.stdout.flush(); sys.exit(1)"
    load = CommandLoad([sys.executable, "-c", flood])
    load.start()
    assert load.proc is not None
    load.proc.wait(timeout=30)
    why = load.ended() or ""
    capfd.readouterr()  # the flood was passed on to stderr in 4 KiB pieces
    assert "exited with status 1" in why and why.endswith("tail words")
    assert len(why) < 200 + TAIL_LINE_CHARS
    assert all(len(line) <= TAIL_LINE_CHARS for line in load.tail)


def test_an_unusable_state_folder_stops_the_run_before_any_load(tmp_path: Path) -> None:
    from agent.apps.accept.request import AcceptRequest
    from agent.apps.accept.run import run_accept
    from agent.policy.config import Config
    from agent.sources.nvml_live import NvmlSession
    from tests.conftest import REPO

    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)  # noqa: S103 - the hostile setup under test
    started = tmp_path / "load-started"
    request = AcceptRequest(config=Config(), profile="hgx-h100-sxm", load="command", state_dir=state, idle_s=0.1,
                            interval_s=0.1, ramp_s=1.0, cooldown_s=0.1, duration_s=10,
                            argv=(sys.executable, "-c", f"open({str(started)!r}, 'w')"),
                            session=NvmlSession.replay(REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "nvml.json"))
    with pytest.raises(FileSafetyError, match="writable"):
        run_accept(request)
    assert not started.exists()
