"""A reload that fails never stops the daemon judging (issue 21, item 4).

Before: a typo in waivers.yaml (re-read at every evaluation) made every evaluation fail; the daemon
served the old findings (an Xid appended to the kernel log never became one) while polls kept
`nodewarden_audit_timestamp_seconds` 0 s old, and nothing said so. Now the last good configuration
keeps judging, `nodewarden_config_reload_success` is 0 with the file named, and the fix is picked
up (SIGHUP, and without one for a watched file).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.apps.daemon.service import Daemon, DaemonSettings
from agent.engine.audit import AuditRequest
from agent.policy.config import load_config
from agent.report.metrics import ServerSettings
from tests.conftest import REPO
from tests.daemon_peer import DaemonProcess, running_daemon
from tests.peers.redfish import free_port

DRIFTED = REPO / "fixtures" / "nodes" / "hgx-h100-drifted"
WAIVED = 'nodewarden_check_waived{check="gpu.power.limit",subject="gpu2"}'
GOOD_WAIVERS = ("waivers:\n  - check: gpu.power.limit\n    subject: gpu2\n"
                "    reason: capped on purpose during the PSU swap\n    expires: 2099-01-01\n")
# Stamped after the recorded log's last record (253,412 s since boot): an earlier one reads as a new boot.
XID_48 = ("3,99001,253500000000,-;NVRM: Xid (PCI:0000:19:00): 48, pid=4242, name=python, "
          "An uncorrectable double bit error")


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A copy of the drifted node whose kernel log can grow (hard links: every file is replaced, not written)."""
    return Path(shutil.copytree(DRIFTED, tmp_path / "node", symlinks=True, copy_function=os.link))


def append_xid(node: Path) -> None:
    kmsg = node / "kmsg.txt"
    text = kmsg.read_text()
    kmsg.unlink()  # a hard link to the fixture: replace, never write through it
    kmsg.write_text(text + XID_48 + "\n")


def series(body: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(body)
            for s in family.samples if s.name == name}


def xid_status(body: str) -> float | None:
    found = [v for labels, v in series(body, "nodewarden_check_status").items()
             if ("check", "gpu.xid") in labels and ("subject", "gpu0") in labels]
    return found[0] if found else None


def reload_state(daemon: DaemonProcess) -> tuple[float | None, dict[str, float]]:
    body = daemon.scrape()[1]
    failed = {dict(labels)["file"]: v for labels, v in series(body, "nodewarden_config_reload_failure_info").items()}
    return daemon.value("nodewarden_config_reload_success", body), failed


def test_bad_waivers_keep_the_last_good_ones_judging_and_say_so(tmp_path: Path, node: Path) -> None:
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text(GOOD_WAIVERS)
    config = tmp_path / "config.yaml"
    config.write_text(f"waivers_file: {waivers}\n")
    with running_daemon(tmp_path, "--snapshot", str(node), "--config", str(config)) as daemon:
        daemon.wait_for(lambda: daemon.value(WAIVED) == 1, what="the waiver")
        started = daemon.value("nodewarden_config_last_reload_success_timestamp_seconds")

        waivers.write_text(GOOD_WAIVERS.replace("subject: gpu2", "subject: [gpu2"))  # a typo
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in daemon.log_events() if e.get("event") == "reload"], what="the reload")
        append_xid(node)
        # Still judging, with the last good waivers: the new Xid is a finding, the waiver still waives.
        body = daemon.wait_for(lambda: next((b for b in [daemon.scrape()[1]] if xid_status(b) == 5), None),
                               timeout=15, what="the new Xid as a finding")
        assert daemon.value(WAIVED, body) == 1
        assert daemon.value('nodewarden_xid_errors_total{gpu="0",xid="48"}', body) == 1
        assert not [e for e in daemon.log_events() if e.get("event") == "evaluate"]  # no evaluation failed
        # ... and says the reload failed, naming the file; the last success is the start's load.
        daemon.wait_for(lambda: reload_state(daemon) == (0, {str(waivers): 1}), what="the failed reload")
        assert started is not None and started > time.time() - 120
        assert daemon.value("nodewarden_config_last_reload_success_timestamp_seconds") == started
        failed = [e for e in daemon.log_events() if e.get("event") == "reload" and e.get("ok") is False]
        assert failed and failed[-1]["file"] == str(waivers) and failed[-1]["error"].startswith(f"{waivers}:")

        waivers.write_text(GOOD_WAIVERS)
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: reload_state(daemon) == (1, {}), what="the fixed file")
        after = daemon.value("nodewarden_config_last_reload_success_timestamp_seconds")
        assert after is not None and after > started


def test_a_bad_profile_or_override_is_named_and_its_fix_picked_up_without_sighup(tmp_path: Path,
                                                                                 node: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("expect:\n  sysctl:\n    vm.swappiness: {max: 100, severity: info, reason: site}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\noverrides_file: {overrides}\n")
    with running_daemon(tmp_path, "--snapshot", str(node), "--config", str(config)) as daemon:
        # A broken site profile dropped in without SIGHUP: matching lists the folder at every evaluation.
        broken = profiles / "site-broken.yaml"
        broken.write_text("name: site-broken\nextends: [base\n")
        append_xid(node)
        daemon.wait_for(lambda: xid_status(daemon.scrape()[1]) == 5, timeout=15, what="the Xid, judged")
        assert reload_state(daemon) == (1, {})  # nothing was reloaded yet
        # SIGHUP reads it: the reload fails, naming it; the last good profiles keep judging.
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: reload_state(daemon) == (0, {str(broken): 1}), what="the failed reload")
        broken.unlink()  # the fix, without SIGHUP: the failed file is watched
        daemon.wait_for(lambda: reload_state(daemon) == (1, {}), what="the fix picked up")

        overrides.write_text("expect:\n  sysctl:\n    vm.swappiness: {max: many}\n")  # no severity, bad max
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: reload_state(daemon) == (0, {str(overrides): 1}), what="the bad override")
        assert xid_status(daemon.scrape()[1]) == 5
        overrides.write_text("expect: {}\n")
        daemon.wait_for(lambda: reload_state(daemon) == (1, {}), what="the fixed override, without SIGHUP")


def test_a_waivers_edit_is_picked_up_without_sighup(tmp_path: Path, node: Path) -> None:
    """The daemon re-read waivers.yaml at every evaluation; now it watches it (a steady node never evaluates)."""
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text("waivers: []\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"waivers_file: {waivers}\n")
    with running_daemon(tmp_path, "--snapshot", str(node), "--config", str(config)) as daemon:
        assert daemon.value(WAIVED) is None
        waivers.write_text(GOOD_WAIVERS)
        daemon.wait_for(lambda: daemon.value(WAIVED) == 1, what="the waiver, without SIGHUP")
        waivers.write_text("waivers: {not: a list}\n")
        daemon.wait_for(lambda: reload_state(daemon) == (0, {str(waivers): 1}), what="the bad file, without SIGHUP")
        assert daemon.value(WAIVED) == 1  # the last good waivers


def test_a_bad_waivers_file_at_start_is_exit_2_naming_it(tmp_path: Path) -> None:
    """No last good waivers to keep: the old daemon started and never judged (never READY); now exit 2."""
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text("waivers: [broken\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"waivers_file: {waivers}\n")
    result = subprocess.run([sys.executable, "-m", "agent", "daemon", "--simulate", "hgx-h100-healthy", "--config",
                             str(config), "--listen", f"127.0.0.1:{free_port()}"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2 and f"{waivers}:2:" in result.stderr, result.stderr[-2000:]


# --- the audit timestamp moves only when checks ran ------------------------------------------------

@pytest.fixture
def daemon() -> Iterator[Daemon]:
    request = AuditRequest(config=load_config(None), simulate="hgx-h100-healthy")
    settings = dataclasses.replace(DaemonSettings(), server=ServerSettings(host="127.0.0.1", port=0))
    made = Daemon(request, settings, None, None, lambda _config: request.bmc)
    yield made
    made.server.start()  # its socket was bound at construction
    made.server.stop()


def audit_stamp(daemon: Daemon) -> float:
    (value,) = series(daemon._freshness().decode(), "nodewarden_audit_timestamp_seconds").values()
    return value


def poll_all(daemon: Daemon) -> None:
    for poller in daemon.pollers:
        daemon._on_result(poller.name, poller._poll())


def test_the_audit_timestamp_stops_while_evaluations_fail(daemon: Daemon) -> None:
    poll_all(daemon)
    daemon._evaluate_and_publish()
    judged = audit_stamp(daemon)
    time.sleep(0.05)
    poll_all(daemon)  # the same facts again: confirmed, the findings are as fresh as the poll
    confirmed = audit_stamp(daemon)
    assert confirmed > judged
    # Judging that cannot run any more (here: the profile it is forced to is gone).
    daemon.request.config.profile = "a-profile-that-is-gone"
    daemon._evaluate_and_publish()
    time.sleep(0.05)
    poll_all(daemon)
    assert audit_stamp(daemon) == confirmed  # polls confirm facts, not findings nobody judged
    daemon.request.config.profile = "auto"
    daemon._evaluate_and_publish()
    assert audit_stamp(daemon) > confirmed
