"""Hostile input to the scheduler gate (issue 24): the state file, the acceptance result, Slurm's
answers (a hung, flooding or lying scontrol/sinfo) and the node name. None may drain or resume on
bad evidence, hang past its bounds, or put unsafe text into a Slurm reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.apps.scheduler.answer import Answer
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm import act, reason_for
from agent.apps.scheduler.state import read_state
from agent.apps.scheduler.trail import MAX_LINE, record
from agent.state.acceptance import accepted_since
from agent.state.ledger import open_ledger

NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
GOOD = {"schema": "nodewarden.health/v1", "verdict": "DRAIN", "gpus": {},
        "actions": [{"action": "drain", "drains": True, "severity": "critical", "checks": ["gpu.lost"],
                     "subjects": ["gpu7"], "message": "GPU 7 lost"}]}

LOST_ACTION: dict[str, Any] = {"action": "drain", "drains": True, "severity": "critical", "checks": ["gpu.lost"],
                               "subjects": ["gpu7"], "message": "GPU 7 lost"}


def state_dir(tmp_path: Path, doc: object | bytes) -> Path:
    folder = tmp_path / "state" / "scheduler"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    (folder / "daemon.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return tmp_path / "state"


@pytest.mark.parametrize(("doc", "why"), [
    (b"{" * 100_000, "unreadable"),  # deep
    (b'{"a": "' + b"x" * (300 << 10) + b'"}', "unreadable"),  # big
    ({**GOOD, "confirmed_at": time.time() + 3600}, "from the future"),
    ({**GOOD, "confirmed_at": "now"}, "no confirmed_at"),
    ({**GOOD, "confirmed_at": float("1e300")}, "no confirmed_at"),
    ({**GOOD, "confirmed_at": time.time(), "verdict": "FINE"}, "no known verdict"),
    ({**GOOD, "confirmed_at": time.time(), "actions": "drain"}, "actions is not a list"),
    ({**GOOD, "confirmed_at": time.time(), "actions": [{"action": 7}]}, "not a string"),
    ({**GOOD, "confirmed_at": time.time(), "schema": "other/v1"}, "not a nodewarden.health/v1"),
    # an action's GPU identities (issue 24.4): a list of objects, each with an index, strings only
    ({**GOOD, "confirmed_at": time.time(), "actions": [{**LOST_ACTION, "gpus": "GPU-1"}]},
     "gpus is not a list"),
    ({**GOOD, "confirmed_at": time.time(), "actions": [{**LOST_ACTION, "gpus": [{"uuid": "GPU-1"}]}]},
     "a GPU without an index"),
    ({**GOOD, "confirmed_at": time.time(), "actions": [{**LOST_ACTION, "gpus": [{"index": True}]}]},
     "a GPU without an index"),
    ({**GOOD, "confirmed_at": time.time(),
      "actions": [{**LOST_ACTION, "gpus": [{"index": 7, "uuid": ["GPU-1"]}]}]},
     "uuid is not a string"),
    ([1, 2], "not an object"),
])
def test_a_hostile_state_file_gives_no_verdict(tmp_path: Path, doc: object, why: str) -> None:
    answer = read_state(state_dir(tmp_path, doc), None)
    assert answer is not None and answer.verdict is None
    assert why in answer.why


def test_a_reason_never_carries_unsafe_text() -> None:
    answer = Answer("DRAIN", "state file", actions=[{
        "action": "drain", "drains": True, "checks": ["gpu.lost"], "subjects": ["gpu7"],
        "message": "lost\n\"quoted\" $(reboot) `x` ' ; Reason=other\x1b[31m" + "y" * 500}])
    reason = reason_for(answer)
    assert reason.startswith("nodewarden: gpu.lost gpu7: lost ")
    assert len(reason) <= 100 and reason.isascii() and reason.isprintable()
    assert not set(reason) & set("\n\"'`$\x1b")


def test_gpu_identities_read_back_are_bounded_and_clean(tmp_path: Path) -> None:
    gpu = {"index": 7, "uuid": "GPU-1\n$(reboot)`x`" + "f" * 500, "serial": "1", "source": "bmc", "extra": "x" * 10}
    doc = {**GOOD, "confirmed_at": time.time(),
           "actions": [{**LOST_ACTION, "gpus": [gpu] * 100}]}
    answer = read_state(state_dir(tmp_path, doc), None)
    assert answer is not None and answer.verdict == "DRAIN"
    (first, *rest) = answer.actions[0]["gpus"]
    assert len(rest) < 16 and set(first) == {"index", "uuid", "serial", "source"}  # unknown keys dropped
    assert len(first["uuid"]) <= 200 and not set(first["uuid"]) & set("\n$`")
    assert len(answer.drained_gpus()) == 1  # one GPU, however often it is named


def test_a_drain_naming_long_gpu_identities_still_leaves_one_json_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    gpus = [{"index": i, "uuid": "GPU-" + "a" * 150, "pci_bus_id": "b" * 200, "serial": "c" * 200,
             "source": "bmc"} for i in range(8)]
    assert record(tmp_path / "state", {"at": 1.0, "action": "drain", "why": "w", "gpus": gpus}) is None
    with open_ledger(tmp_path / "state", readonly=True) as ledger:
        [kept] = ledger.window(0.0, kinds=("drain",))
    line = kept.detail
    assert len(line) <= MAX_LINE
    entry = json.loads(line)  # whole, never cut mid-way
    assert entry["action"] == "drain" and entry["gpus"][7] == {"index": 7, "uuid": "GPU-" + "a" * 150}


def fake_tools(tmp_path: Path, scontrol: str, sinfo: str) -> HealthSettings:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("scontrol", scontrol), ("sinfo", sinfo)):
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "state").mkdir(mode=0o700, exist_ok=True)
    return HealthSettings(state_dir=tmp_path / "state", slurm_bin_dir=bin_dir, slurm_timeout_s=1.0)


SHOW = "echo 'NodeName=n1 Arch=x86_64 State=IDLE ThreadsPerCore=1 Partitions=gpu'"
DRAIN = Answer("DRAIN", "state file", actions=GOOD["actions"])  # type: ignore[arg-type]


def test_a_hung_scontrol_is_cut_at_its_timeout_and_nothing_is_done(tmp_path: Path) -> None:
    settings = fake_tools(tmp_path, "exec sleep 60", "echo")
    started = time.monotonic()
    decision = act(DRAIN, "n1", settings, dry_run=False)
    assert time.monotonic() - started < 5
    assert decision.action == "failed" and "timed out after 1 s" in decision.why


def test_a_flooding_sinfo_is_cut_and_the_drain_withheld(tmp_path: Path) -> None:
    log = tmp_path / "updates"
    settings = fake_tools(tmp_path, f'[ "$1" = update ] && echo "$@" >>{log}; {SHOW}',
                          "exec yes 'n2|nodewarden: x'")
    decision = act(DRAIN, "n1", settings, dry_run=False)
    assert decision.action == "failed" and "more than" in decision.why
    assert not log.exists()


def test_a_foreign_reason_that_merely_mentions_us_is_not_ours(tmp_path: Path) -> None:
    log = tmp_path / "updates"
    settings = fake_tools(tmp_path, f'[ "$1" = update ] && echo "$@" >>{log}; '
                          "echo 'NodeName=n1 State=IDLE+DRAIN Partitions=gpu'",
                          """echo '{"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], '"""
                          """'"reason": "maint: nodewarden: said so", "partitions": ["gpu"]}]}'""")
    healthy = Answer("OK", "state file")
    for answer in (healthy, healthy, DRAIN):
        decision = act(answer, "n1", settings, dry_run=False)
        assert decision.action == "none" and "not nodewarden's" in decision.why
    assert not log.exists()


def test_a_node_name_that_is_not_a_slurm_name_is_refused(tmp_path: Path) -> None:
    for name in ("a b", "../../etc/passwd", "n1;reboot", "x" * 65, "-rf", ".."):
        done = subprocess.run([NODEWARDEN, "health-check", "--slurm", "--dry-run", "--node", name,
                               "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "a Slurm node name" in done.stderr


@pytest.mark.parametrize("doc", [
    {"passed": "true", "finished_at": "2030-01-01T00:00:00Z"},
    {"passed": True, "finished_at": 12},
    {"passed": True, "finished_at": "x" * 100},
    {"passed": True},
    ["passed"],
])
def test_a_malformed_acceptance_result_never_allows_a_resume(tmp_path: Path, doc: object) -> None:
    (tmp_path / "accept").mkdir()
    (tmp_path / "accept" / "last.json").write_text(json.dumps(doc))
    passed, _ = accepted_since(tmp_path, 0.0)
    assert passed is False


def test_an_acceptance_result_someone_else_owns_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "accept").mkdir()
    last = tmp_path / "accept" / "last.json"
    last.write_text(json.dumps({"passed": True, "finished_at": "2030-01-01T00:00:00Z"}))
    assert accepted_since(tmp_path, 0.0)[0] is True
    os.chown(last, 65534, 65534)
    passed, why = accepted_since(tmp_path, 0.0)
    assert passed is False and "not root's" in why


def test_the_start_sweep_takes_no_link_and_no_file_of_another_user(tmp_path: Path) -> None:
    """Under the temporary-file name of daemon.json: a symlink to a file that must survive, a file of
    another user, and a folder. The daemon's first write removes only its own old temporary file."""
    from agent.apps.scheduler.state import DaemonStateFile
    from agent.engine.audit import AuditRequest, run_audit
    from agent.policy.config import Config

    folder = state_dir(tmp_path, GOOD).joinpath("scheduler")
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    ours, link, theirs, inner = (folder / f".daemon.json.{n * 12}.tmp" for n in "abcd")
    ours.write_text("{}\n")
    theirs.write_text("{}\n")
    os.chown(theirs, 65534, 65534)
    link.symlink_to(victim)
    inner.mkdir()
    old = time.time() - 3600
    for path in (ours, theirs, inner, victim):
        os.utime(path, (old, old))
    os.utime(link, (old, old), follow_symlinks=False)
    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-healthy"))
    DaemonStateFile(tmp_path / "state", {}).update(report, time.time(), {})
    assert not ours.exists()
    assert link.is_symlink() and theirs.exists() and inner.is_dir() and victim.read_text() == "keep\n"
    assert json.loads((folder / "daemon.json").read_text())["verdict"] == "OK"


def test_a_failing_scontrol_is_said_in_one_line_naming_its_slurm_conf(tmp_path: Path) -> None:
    """Issue 36.6: scontrol's retries repeat one error over many lines; the first line and the slurm.conf
    it read are what an operator acts on."""
    import sys

    from agent.apps.scheduler.slurm_cli import SlurmError, run_bounded

    noisy = ("import sys\nfor i in range(6):\n    print(f'scontrol: error: resolve_ctls_from_dns_srv: res_nsearch "
             "error: Unknown host (try {i})', file=sys.stderr)\nsys.exit(1)\n")
    conf = str(tmp_path / "slurm.conf")
    with pytest.raises(SlurmError) as caught:
        run_bounded([sys.executable, "-c", noisy], {"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"}, 10.0)
    message = str(caught.value)
    assert "\n" not in message and message.count("res_nsearch") == 1 and "(try 0)" in message
    assert message.endswith(f"(slurm.conf: {conf})")
    with pytest.raises(SlurmError) as slow:
        run_bounded([sys.executable, "-c", "import time; time.sleep(5)"], {"PATH": "/usr/bin:/bin"}, 0.3)
    assert "timed out" in str(slow.value) and "(slurm.conf: the default slurm.conf" in str(slow.value)
