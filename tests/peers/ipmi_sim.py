"""pytest harness: OpenIPMI's `ipmi_sim` as a loopback BMC of a GPU node.

Recipe from /work/shared/peers/20-ipmi-sim.sh and shared/peers/README.md section 3b; the
configuration lives in tests/peers/ipmi/ (gpu.sdrs, gpu.emu, lan.conf, chassis.sh, mkfru.py).

Each simulator gets a fresh state directory (the SEL and users persist there), SDRs compiled
with `sdrcomp -8` (8-bit names; `six_bit_names=True` leaves -8 out, which packs all-caps names
such as "FAN1" as 6-bit ASCII, the names pyghmi 1.6.19 never finishes decoding), a free UDP port
for RMCP+ and a free TCP port for the emulator console, which `IpmiSim.inject` uses to change
sensors and add SEL records at runtime (ipmi_sim_cmd(5) syntax).

Fixtures:
* `ipmi_sim` (session scope): one shared healthy simulator, for tests that do not inject faults;
* `ipmi_sim_factory`: starts fresh simulators on demand and stops them after the test.

To use them, import `ipmi_sim_fixture` and `ipmi_sim_factory_fixture` into the test module (or
list this module in a conftest's `pytest_plugins`).

`ipmi_sim` missing is a failure, not a skip: CI installs it with `python -m tests.peers.setup`.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers import processes
from tests.peers.locations import SETUP_COMMAND

CONFIG_DIR = Path(__file__).resolve().parent / "ipmi"
USER = "admin"
PASSWORD = "Gpu-sim-S3cret!"  # distinctive, so tests can prove it leaks nowhere
# What tests/peers/ipmi/ sets up (tests assert these).
FRU_MANUFACTURER = "Acme Compute"
FRU_PRODUCT = "G8X-H100 GPU Server"
BMC_FIRMWARE = "2.51"
SENSOR = {"GPU0_Temp": 1, "GPU1_Temp": 2, "Inlet_Temp": 3, "FAN1": 4, "FAN2": 5,
          "PSU1_Status": 6, "PSU2_Status": 7, "Sys_Power": 8, "P12V": 9}
VOLT_PER_COUNT = 0.06  # P12V's SDR (m 6, r_exp -2)
FAN_COUNTS_TO_RPM = 100
PRODUCT_ID, SIX_BIT_PRODUCT_ID = "0x0f02", "0x0f06"  # Get Device ID product (gpu.emu's mc_add)
INSTALL_HINT = f"run `{SETUP_COMMAND}` (as root: apt-get install openipmi ipmitool) to install it"
START_TIMEOUT_S = 10.0

# Get Channel Authentication Capabilities (IPMI 1.5 framing, no session): any answer means the
# simulator's LAN interface is up. 06 00 ff 07 = RMCP header, then the session header, then
# rsAddr 0x20, netFn 6 (App), checksum, rqAddr 0x81, seq, cmd 0x38, channel 0x0e, admin, checksum.
_AUTH_CAPS_PING = bytes.fromhex("0600ff07" "00" "00000000" "00000000" "09" "2018c8" "810038" "0e04" "35")


class SimError(RuntimeError):
    """The simulator did not start or refused a console command."""


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    """A port nobody listens on right now (UDP by default) on 127.0.0.1."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_tools() -> None:
    missing = [tool for tool in ("ipmi_sim", "sdrcomp") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found on PATH: {INSTALL_HINT}", pytrace=False)


@dataclass
class IpmiSim:
    """One running ipmi_sim. host/port/user/password are what a client needs."""

    host: str
    port: int
    user: str
    password: str
    console_port: int
    workdir: Path
    process: subprocess.Popen[bytes]
    log: Path
    injected: list[str] = field(default_factory=list)

    def inject(self, *commands: str, timeout_s: float = 5.0) -> str:
        """Run emulator console commands, e.g. 'sensor_set_value 0x20 0 1 95 1'; returns their output.

        Raises SimError when ipmi_sim rejects one (it prints "**..." then).
        """
        output: list[str] = []
        with socket.create_connection(("127.0.0.1", self.console_port), timeout=timeout_s) as sock:
            _read_prompt(sock)  # telnet negotiation bytes, then "> "
            for command in commands:
                sock.sendall(command.encode() + b"\n")
                answer = _read_prompt(sock).replace("\r", "")
                lines = [line for line in answer.splitlines() if line.strip() and line.strip() != command]
                errors = [line for line in lines if line.startswith("**")]
                if errors:
                    raise SimError(f"ipmi_sim rejected {command!r}: {' '.join(errors)}")
                output.extend(lines)
                self.injected.append(command)
        return "\n".join(output)

    def set_sensor(self, name: str, raw_value: int, events: bool = True) -> str:
        """Set a sensor's raw byte (°C for temperatures, counts of 100 RPM for fans)."""
        return self.inject(f"sensor_set_value 0x20 0 {SENSOR[name]} {raw_value} {int(events)}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop this simulator (its own process group only)."""
        processes.stop(self.process, timeout_s=3)


def _read_prompt(sock: socket.socket) -> str:
    buffer = b""
    while not buffer.endswith(b"> "):
        chunk = sock.recv(4096)
        if not chunk:
            raise SimError(f"ipmi_sim closed its console (got {buffer[-200:]!r})")
        buffer += chunk
    return buffer[:-2].decode("utf-8", "replace")


def start_ipmi_sim(workdir: Path, *, six_bit_names: bool = False, user: str = USER,
                   password: str = PASSWORD) -> IpmiSim:
    """Start ipmi_sim in `workdir` (created, must be fresh) and wait until its LAN port answers."""
    require_tools()
    state = workdir / "state"
    sdr_dir = state / "ipmi_sim" / "gpusim"
    sdr_dir.mkdir(parents=True)
    sdrcomp = ["sdrcomp", "-o", str(sdr_dir / "sdr.20.main"), str(CONFIG_DIR / "gpu.sdrs")]
    if not six_bit_names:
        sdrcomp.insert(1, "-8")  # 8-bit ASCII names; see gpu.sdrs
    _run(sdrcomp)
    fru = workdir / "fru0.bin"
    _run([sys.executable, str(CONFIG_DIR / "mkfru.py"), str(fru)])
    chassis = workdir / "chassis.sh"
    shutil.copyfile(CONFIG_DIR / "chassis.sh", chassis)
    chassis.chmod(0o755)
    port, console_port = free_port(), free_port(socket.SOCK_STREAM)
    lan = (CONFIG_DIR / "lan.conf").read_text()
    for key, value in (("CHASSIS_SCRIPT", str(chassis)), ("LAN_PORT", str(port)),
                       ("CONSOLE_PORT", str(console_port)), ('"USER"', f'"{user}"'),
                       ('"PASSWORD"', f'"{password}"')):
        lan = lan.replace(key, value)
    (workdir / "lan.conf").write_text(lan)
    emu = (CONFIG_DIR / "gpu.emu").read_text().replace("FRU_FILE", str(fru))
    if six_bit_names:
        if f"{PRODUCT_ID} persist_sdr" not in emu:
            raise SimError(f"gpu.emu's mc_add no longer ends in '{PRODUCT_ID} persist_sdr'")
        # pyghmi caches decoded SDRs per process, keyed by firmware, manufacturer, product, device id
        # and SDR timestamp: give this BMC another product id so a cached 8-bit SDR cannot mask the hang.
        emu = emu.replace(f"{PRODUCT_ID} persist_sdr", f"{SIX_BIT_PRODUCT_ID} persist_sdr")
    (workdir / "gpu.emu").write_text(emu)
    log = workdir / "ipmi_sim.log"
    with log.open("wb") as out:
        process = processes.spawn(
            ["ipmi_sim", "-c", str(workdir / "lan.conf"), "-f", str(workdir / "gpu.emu"), "-s", str(state), "-n"],
            stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    sim = IpmiSim("127.0.0.1", port, user, password, console_port, workdir, process, log)
    try:
        _wait_ready(sim)
    except BaseException:
        sim.stop()
        raise
    return sim


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise SimError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr or result.stdout}")


def _wait_ready(sim: IpmiSim) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.05)
        while time.monotonic() < deadline:
            if not sim.alive():
                raise SimError(f"ipmi_sim exited ({sim.process.returncode}): {sim.log.read_text(errors='replace')}")
            with contextlib.suppress(OSError):
                sock.sendto(_AUTH_CAPS_PING, (sim.host, sim.port))
                if sock.recvfrom(512)[0][:4] == b"\x06\x00\xff\x07":
                    return
            time.sleep(0.02)
    raise SimError(f"ipmi_sim did not answer on udp/{sim.port} within {START_TIMEOUT_S:g} s: "
                   f"{sim.log.read_text(errors='replace')}")


@contextlib.contextmanager
def running_ipmi_sim(workdir: Path, **options: object) -> Iterator[IpmiSim]:
    sim = start_ipmi_sim(workdir, **options)  # type: ignore[arg-type]
    try:
        yield sim
    finally:
        sim.stop()


StartSim = Callable[..., IpmiSim]


@pytest.fixture(scope="session", name="ipmi_sim")
def ipmi_sim_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiSim]:
    """One healthy simulator shared by the session: do not inject faults into it."""
    with running_ipmi_sim(tmp_path_factory.mktemp("ipmi_sim_shared")) as sim:
        yield sim


@pytest.fixture(name="ipmi_sim_factory")
def ipmi_sim_factory_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """start(six_bit_names=False, user=..., password=...) -> a fresh simulator, stopped after the test."""
    started: list[IpmiSim] = []

    def start(**options: object) -> IpmiSim:
        sim = start_ipmi_sim(tmp_path_factory.mktemp("ipmi_sim"), **options)  # type: ignore[arg-type]
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()
