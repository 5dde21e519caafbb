"""Load runners with real processes (no NVML): a command that runs, one that exits early, one that
ignores SIGTERM (and leaves a child that does too), one that does not exist; the torch runner's
GPU-free paths. Then whole runs over a recorded idle node, where a load that never reaches load,
dies, or cannot start is a clear failed result, never a hang."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent.apps.accept.run import AcceptRequest, run_accept
from agent.apps.accept.runners import CommandLoad, LoadError, TorchLoad, make_runner
from agent.policy.config import Config
from agent.sources.nvml_live import NvmlSession
from tests.conftest import REPO

PY = sys.executable
IGNORES_TERM = ("import os, signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "child = os.fork()\n"
                "if child == 0:\n"
                "    time.sleep(60); sys.exit(0)\n"
                "open(sys.argv[1], 'w').write(f'{os.getpid()} {child}')\n"
                "time.sleep(60)\n")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ")[-1][0] != "Z"  # a zombie is gone for our purpose
    except FileNotFoundError:
        return False


def _wait(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_running_command_runs_until_stopped_with_sigterm() -> None:
    load = CommandLoad([PY, "-c", "import time; print('burning', flush=True); time.sleep(60)"])
    load.start()
    assert load.proc is not None
    _wait(lambda: list(load.tail) == ["burning"])
    assert load.ended() is None
    assert load.stop(grace_s=5) == "stopped with SIGTERM"
    assert not _alive(load.proc.pid)
    assert load.ended() is not None and "killed by signal 15" in (load.ended() or "")


def test_a_command_that_exits_early_says_how_and_its_last_words() -> None:
    load = CommandLoad([PY, "-c", "import sys; print('cuda init failed', flush=True); sys.exit(3)"])
    load.start()
    _wait(lambda: load.ended() is not None)
    why = load.ended() or ""
    assert "exited with status 3" in why and why.endswith(": cuda init failed")
    assert load.stop(grace_s=1) == "already ended"


def test_a_command_ignoring_sigterm_is_killed_with_its_group_after_the_grace(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    load = CommandLoad([PY, "-c", IGNORES_TERM, str(pids)])
    load.start()
    _wait(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    leader, child = map(int, pids.read_text().split())
    started = time.monotonic()
    assert load.stop(grace_s=0.5) == "did not stop within 0.5 s of SIGTERM: killed"
    assert time.monotonic() - started < 5
    assert not _alive(leader)
    _wait(lambda: not _alive(child))  # the forked child in the same group goes too


STAND_IN = """
import sys, time
from agent.apps.accept.runners import CommandLoad
load = CommandLoad(sys.argv[1:])
load.start()
print(load.proc.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("ignores_term", [False, True], ids=["load ends on SIGTERM", "load ignores SIGTERM"])
def test_the_load_and_its_forked_workers_die_when_accept_is_killed(tmp_path: Path, ignores_term: bool) -> None:
    """Issue 30.9: accept killed by SIGKILL (the OOM killer, a stop timeout) leaves no load running."""
    import signal
    import subprocess

    pids = tmp_path / "pids"
    load = [PY, "-c", IGNORES_TERM, str(pids)] if ignores_term else [
        "sh", "-c", f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; wait"]
    accept = subprocess.Popen([PY, "-c", STAND_IN, *load], cwd=REPO, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    started: list[int] = []
    try:
        assert accept.stdout is not None
        guard = int(accept.stdout.readline())
        _wait(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        started = [guard, *map(int, pids.read_text().split())]
        assert all(_alive(pid) for pid in started)
        accept.kill()  # SIGKILL: no handler, no finally, no atexit in accept
        accept.wait()
        _wait(lambda: not any(_alive(pid) for pid in started), timeout_s=20.0)  # the guard's 10 s grace, then KILL
    finally:
        if accept.poll() is None:
            accept.kill()
            accept.wait()
        for pid in started:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_ends_as_the_load_did() -> None:
    load = CommandLoad([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"])
    load.start()
    _wait(lambda: load.ended() is not None)
    assert "was killed by signal 10" in (load.ended() or "")  # the load's signal, not the guard's status


def test_a_missing_command_cannot_start() -> None:
    with pytest.raises(LoadError, match=r"^load could not start: /nonexistent/gpu_burn: No such file"):
        CommandLoad(["/nonexistent/gpu_burn"]).start()
    with pytest.raises(LoadError, match="needs the command after --"):
        make_runner("command", (), 10)


def test_torch_runner_without_torch_is_a_clear_message() -> None:
    assert "torch" not in sys.modules
    with pytest.raises(LoadError, match=r"load could not start: PyTorch is not installed \(pip install 'nodewarden"):
        TorchLoad(10).start()


FAKE_TORCH = "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"


@pytest.fixture(scope="module")
def python_with_fake_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter (a venv of ours) whose own site-packages holds a torch that sees no CUDA: what
    the isolated child imports is the interpreter's, so that is where a test's torch must live."""
    import subprocess
    import sysconfig

    venv = tmp_path_factory.mktemp("venv-fake-torch")
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "torch").mkdir(parents=True)
    (purelib / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return str(venv / "bin" / "python")


def test_torch_runner_without_cuda_says_so(python_with_fake_torch: str) -> None:
    load = TorchLoad(10, python=python_with_fake_torch)
    load.start()
    _wait(lambda: load.ended() is not None)
    why = load.ended() or ""
    assert why.startswith("the load exited with status 3") and why.endswith(": PyTorch sees no CUDA device")


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A folder `nobody` owns in a sticky, world-writable one (a /tmp), holding a torch.py and a
    module named like the stdlib's that the burn imports: each leaves a mark if it ever runs."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    plant = sticky / "work"
    plant.mkdir()
    mark = tmp_path / "planted-code-ran"
    for name in ("torch.py", "argparse.py", "sitecustomize.py"):
        (plant / name).write_text(f"open({str(mark)!r}, 'a').write({name!r} + '\\n')\n")
    if os.geteuid() == 0:
        for path in (plant, *plant.iterdir()):
            os.chown(path, 65534, 65534)
    return plant, mark


def test_the_burn_never_imports_from_where_accept_was_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              python_with_fake_torch: str) -> None:
    plant, mark = _planted(tmp_path)
    monkeypatch.chdir(plant)  # root started accept from there
    monkeypatch.setenv("PYTHONPATH", str(plant))
    monkeypatch.setenv("PYTHONSTARTUP", str(plant / "torch.py"))
    monkeypatch.syspath_prepend(str(plant))  # and our own sys.path holds it (python -m agent from that folder)
    # the interpreter nodewarden runs in has no torch: refused by what the child would see, not by our sys.path
    with pytest.raises(LoadError, match="PyTorch is not installed"):
        TorchLoad(5).start()
    # one that has torch runs the burn, and only its own torch is imported
    load = TorchLoad(5, python=python_with_fake_torch)
    load.start()
    _wait(lambda: load.ended() is not None)
    assert (load.ended() or "").endswith(": PyTorch sees no CUDA device")
    assert not mark.exists(), f"planted code ran as uid {os.geteuid()}: {mark.read_text()!r}"
    assert load.proc is not None and load.proc.args[1] == "-I" and os.path.isabs(load.proc.args[2])


def test_the_burn_child_starts_in_slash_with_a_clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 python_with_fake_torch: str) -> None:
    fake_site = Path(python_with_fake_torch).parent.parent
    report = tmp_path / "child.json"
    (fake_site / "sitecustomize.py").write_text(  # runs first in the child: say where it started and with what
        f"import json, os\njson.dump({{'cwd': os.getcwd(), 'env': dict(os.environ)}}, open({str(report)!r}, 'w'))\n")
    purelib = next(fake_site.glob("lib/python*/site-packages"))
    (fake_site / "sitecustomize.py").rename(purelib / "sitecustomize.py")
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.chdir(tmp_path)
    try:
        load = TorchLoad(5, python=python_with_fake_torch)
        load.start()
        _wait(lambda: load.ended() is not None)
    finally:
        (purelib / "sitecustomize.py").unlink()
    seen = json.loads(report.read_text())
    assert seen["cwd"] == "/"
    assert not {"LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"} & set(seen["env"]), seen["env"]
    assert seen["env"]["PATH"].split(":") == [d for d in seen["env"]["PATH"].split(":") if d.startswith("/")]


def test_an_interpreter_others_can_change_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = shared / "python"
    link.symlink_to(os.path.realpath(PY))
    with pytest.raises(LoadError, match=r"load could not start: .*Python interpreter for --load torch"):
        TorchLoad(5, python=str(link)).start()


# --- whole runs over a recorded node (idle GPUs: utilization 0) -----------------------------------------


def _request(tmp_path: Path, load: str, argv: tuple[str, ...] = ()) -> AcceptRequest:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return AcceptRequest(config=Config(), profile="hgx-h100-sxm", load=load, argv=argv, duration_s=10,
                         interval_s=0.1, idle_s=0.2, ramp_s=1.0, cooldown_s=0.2, grace_s=1.0, state_dir=state,
                         session=NvmlSession.replay(REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "nvml.json"))


def _load_finding(outcome: object) -> dict[str, object]:
    report = outcome.report  # type: ignore[attr-defined]
    return next(f.to_json() for f in report.findings if f.check == "accept.load" and f.subject == "node")


def test_a_load_that_never_reaches_load_fails_clearly_and_is_stopped(tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    script = f"import os, time; open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    started = time.monotonic()
    outcome = run_accept(_request(tmp_path, "command", (PY, "-c", script)))
    assert time.monotonic() - started < 8  # ramp 1 s, then stopped: no 10 s steady on an idle node
    finding = _load_finding(outcome)
    assert finding["status"] == "fail"
    assert "never reached 80 % utilization on gpu0" in str(finding["message"])
    assert outcome.report.exit_code == 1
    assert not _alive(int(pids.read_text()))
    last = json.loads((tmp_path / "state" / "accept" / "last.json").read_text())
    assert last["passed"] is False and last["baseline"] is None


def test_a_load_that_dies_during_ramp_is_a_failed_result(tmp_path: Path) -> None:
    outcome = run_accept(_request(tmp_path, "command", (PY, "-c", "import sys; print('oom'); sys.exit(2)")))
    message = str(_load_finding(outcome)["message"])
    assert "exited with status 2" in message and "oom" in message and "during ramp" in message


def test_torch_without_torch_is_a_failed_result_not_a_hang(tmp_path: Path) -> None:
    outcome = run_accept(_request(tmp_path, "torch"))
    assert _load_finding(outcome)["message"] == ("load torch: load could not start: PyTorch is not installed "
                                                 "(pip install 'nodewarden[load]', or use --load command -- CMD)")
    assert outcome.report.exit_code == 1
    assert outcome.recording.phases.keys() == {"idle"}


def test_a_run_that_cannot_read_nvml_exits_3_and_withdraws_an_older_pass(tmp_path: Path) -> None:
    from agent.core.errors import AuditError

    def no_binding() -> object:
        raise ImportError("No module named 'pynvml'")

    request = _request(tmp_path, "none")
    accept_dir = tmp_path / "state" / "accept"
    accept_dir.mkdir(mode=0o700)
    (accept_dir / "last.json").write_text('{"passed": true, "finished_at": "2026-01-01T00:00:00+00:00"}')
    request.session = NvmlSession(no_binding, recorded=False)
    with pytest.raises(AuditError, match=r"NVML unavailable: pynvml \(nvidia-ml-py\) is not installed") as caught:
        run_accept(request)
    assert caught.value.exit_code == 3
    last = json.loads((accept_dir / "last.json").read_text())
    assert last["passed"] is False and "NVML unavailable" in last["error"]
