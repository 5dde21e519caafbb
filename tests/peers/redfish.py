"""Real Redfish peers on 127.0.0.1 for tests: sushy-static, a mitmdump fault proxy, TLS, a silent BMC.

The servers come from isolated virtualenvs made by `python -m tests.peers.setup`
(`tests.peers.locations.peers_dir()/{sushy,mitm,emulator}`); their dependencies never enter the project's venv.
If they are missing, the tests FAIL (they do not skip) and say how to create them.

Plain context managers (usable from benchmarks and other fixtures):

    with sushy_static(mockup("hpe-dl380a-gen11")) as bmc:          # RedfishPeer(url, log_path, pid)
        with fault_proxy(bmc.url) as px:                            # FaultProxy
            px.set_rules(["/Chassis/1/Thermal$ status 503", "latency 0.05"])
            ...; assert px.requests()["/redfish/v1/Chassis/1/Thermal"] == 1
    tls = self_signed_tls(tmp_path)                                 # TlsFiles(cert, key, ca)
    with sushy_static(mockup("supermicro-x10"), tls=tls) as bmc: ...  # https://127.0.0.1:<port>
    with silent_listener() as (host, port): ...                     # accepts, never answers

Pytest fixtures (import them into a test module to use them there, and name them in the module's
`__all__` so that ruff's F401 accepts the import; see tests/integration/test_redfish_peers.py):
    redfish_peers         function scope, a RedfishPeers whose peers stop at test teardown
    redfish_peers_module  the same, module scope

Notes on the peers (see shared/peers/README.md section 2):
- sushy-static serves `<dir>/<path>/index.json` only; it ignores credentials, answers 404 to any query
  string ($expand) and to /redfish, and answers POST/PATCH with 204 while storing nothing, so session
  login fails in clients: use basic auth. It is single-threaded (one request at a time).
- sushy-static prints every request's headers, Authorization included: its output goes to
  `RedfishPeer.log_path` only. Do not print that file in test output.
- The fault proxy runs with connection_strategy=lazy: it connects upstream only after the rules let a
  request through, so a delayed or hung request never holds the single-threaded sushy-static.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers import processes
from tests.peers.locations import SETUP_COMMAND, peers_dir

REPO = Path(__file__).resolve().parents[2]
MOCKUPS = REPO / "fixtures" / "redfish"
ADDON = Path(__file__).resolve().with_name("redfish_fault_addon.py")
SETUP_HINT = f"run `{SETUP_COMMAND}` from the repository root to create them"
START_TIMEOUT_S = 20.0
PING_PATH = "/__faultproxy__/ping"  # answered by the addon itself, never counted
ACTIONS = ("status", "delay", "hang", "reset", "body", "missing", "latency")


# --- locating the peers -------------------------------------------------------------------------


def peer_bin(venv: str, script: str) -> Path:
    """Absolute path of a console script in a peers venv; fails the test (no skip) when missing."""
    path = peers_dir() / venv / "bin" / script
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"Redfish test peer {script!r} not found at {path}: {SETUP_HINT}", pytrace=False)
    return path


def mockup(name: str) -> Path:
    """fixtures/redfish/<name>: a tall DMTF mockup (its service root is <name>/redfish/v1/index.json)."""
    path = MOCKUPS / name
    if not (path / "redfish" / "v1" / "index.json").is_file():
        raise FileNotFoundError(f"no Redfish mockup {name!r} under {MOCKUPS}")
    return path


def mockup_names() -> list[str]:
    """Every servable mockup under fixtures/redfish (those with a ServiceRoot index.json)."""
    return sorted(p.parents[2].name for p in MOCKUPS.glob("*/redfish/v1/index.json"))


def _service_root_dir(mockup_dir: Path) -> Path:
    mockup_dir = Path(mockup_dir)
    for candidate in (mockup_dir / "redfish" / "v1", mockup_dir):
        if (candidate / "index.json").is_file():
            return candidate.resolve()
    raise FileNotFoundError(f"{mockup_dir} holds no ServiceRoot index.json (neither redfish/v1/index.json nor index.json)")


# --- processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_die_with_parent = processes.die_with_parent  # for tests/daemon_peer.py and tests/integration/test_daemon.py's own Popen


def _spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return processes.spawn(argv, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop exactly this process and its group (never by name)."""
    processes.stop(proc)


def _no_proxy_opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    handlers: list[Any] = [urllib.request.ProxyHandler({})]  # never route loopback through $http_proxy
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def _wait_http(
    url: str, proc: subprocess.Popen[bytes], log_path: Path, context: ssl.SSLContext | None = None,
    expect: bytes | None = None,
) -> None:
    """Poll URL until it answers 200 (and contains `expect`), the process dies, or START_TIMEOUT_S passes."""
    opener = _no_proxy_opener(context)
    deadline = time.monotonic() + START_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            name = Path(str(proc.args[0] if isinstance(proc.args, list) else proc.args)).name
            raise RuntimeError(f"{name} exited with {proc.returncode} before answering {url}; see {log_path}")
        try:
            with opener.open(url, timeout=1) as r:
                body = r.read()
                if r.status == 200 and (expect is None or expect in body):
                    return
                last = f"HTTP {r.status}"
        except (OSError, urllib.error.URLError) as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {START_TIMEOUT_S:.0f} s (last: {last!r}); see {log_path}")


@contextlib.contextmanager
def _workdir(prefix: str, workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- TLS -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    cert: Path  # server certificate (PEM) for 127.0.0.1 / localhost, signed by `ca`
    key: Path  # its private key (PEM, unencrypted)
    ca: Path  # the CA certificate (PEM) that a verifying client must be given


def self_signed_tls(tmp: Path, name: str = "bmc") -> TlsFiles:
    """A throwaway CA and a server certificate for IP 127.0.0.1 (and DNS localhost), valid for 2 days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nodewarden test CA ({name})")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(cert=tmp / f"{name}-cert.pem", key=tmp / f"{name}-key.pem", ca=tmp / f"{name}-ca.pem")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files.key.chmod(0o600)
    return files


# --- sushy-static ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedfishPeer:
    url: str  # e.g. http://127.0.0.1:40123 (no trailing slash, no /redfish/v1)
    log_path: Path  # server output: contains Authorization headers, never print it
    pid: int


@contextlib.contextmanager
def sushy_static(mockup_dir: Path, tls: TlsFiles | None = None, workdir: Path | None = None) -> Iterator[RedfishPeer]:
    """Serve a DMTF mockup read-only with sushy-static on 127.0.0.1:<free port>.

    `mockup_dir` is either fixtures/redfish/<name> (holding redfish/v1/index.json) or the directory
    holding the ServiceRoot index.json itself. With `tls`, the peer speaks HTTPS only.
    """
    exe = peer_bin("sushy", "sushy-static")
    root = _service_root_dir(mockup_dir)
    scheme = "https" if tls else "http"
    context = ssl.create_default_context(cafile=str(tls.ca)) if tls else None
    with _workdir("nodewarden-sushy-", workdir) as wd:
        def argv(port: int) -> list[str]:
            tls_args = ["-c", str(tls.cert), "-k", str(tls.key)] if tls else []
            return [str(exe), "-i", "127.0.0.1", "-p", str(port), "-m", str(root), *tls_args]

        with _serving(wd, "sushy-static", argv, scheme, context) as peer:
            yield peer


@contextlib.contextmanager
def _serving(wd: Path, name: str, argv: Any, scheme: str = "http",
             context: ssl.SSLContext | None = None) -> Iterator[RedfishPeer]:
    """Start `argv(port)` on a free port until it answers /redfish/v1/ (a free port can be taken
    between probing and binding: three tries), yield the peer, stop exactly that process."""
    for attempt in range(3):
        port = free_port()
        log_path = wd / f"{name}-{port}.log"
        proc = _spawn(argv(port), log_path)
        url = f"{scheme}://127.0.0.1:{port}"
        try:
            _wait_http(f"{url}/redfish/v1/", proc, log_path, context)
        except RuntimeError:
            _stop(proc)
            if attempt == 2:
                raise
            continue
        try:
            yield RedfishPeer(url=url, log_path=log_path, pid=proc.pid)
        finally:
            _stop(proc)
        return


# --- sushy-emulator (writable BIOS) ------------------------------------------------------------------


EMULATOR_SYSTEM = "/redfish/v1/Systems/6695eb01-f6a4-8304-79aa-97f2502e193f"  # libvirt's test:///default domain


@contextlib.contextmanager
def sushy_emulator(user: str, password: str, workdir: Path | None = None) -> Iterator[RedfishPeer]:
    """A dynamic Redfish service whose BIOS takes `@Redfish.Settings` PATCHes, with HTTP basic auth.

    sushy-emulator's BIOS needs its libvirt driver; libvirt's built-in `test:///default` driver
    keeps one in-memory domain per process, so each start begins with the same BIOS and needs no
    libvirtd. The venv (`emulator`) sees Debian's python3-libvirt through system site-packages;
    `python -m tests.peers.setup` creates it. This emulator applies a PATCH to the current BIOS at once,
    where a real BMC stages it until the next boot.
    """
    exe = peer_bin("emulator", "sushy-emulator")
    python = exe.with_name("python")
    with _workdir("nodewarden-emulator-", workdir) as wd:
        htpasswd = wd / "htpasswd"
        hashed = subprocess.run(
            [str(python), "-c", "import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.read().encode(), "
             "bcrypt.gensalt(rounds=4)).decode())"],  # cost 4: cost 12 makes every request pay ~200 ms
            input=password, capture_output=True, text=True, check=True).stdout.strip()
        htpasswd.write_text(f"{user}:{hashed}\n")
        htpasswd.chmod(0o600)
        def argv(port: int) -> list[str]:
            config = wd / f"emulator-{port}.conf"
            config.write_text(
                f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\n"
                f"SUSHY_EMULATOR_LIBVIRT_URI = 'test:///default'\nSUSHY_EMULATOR_AUTH_FILE = '{htpasswd}'\n"
                f"SUSHY_EMULATOR_STATE_DIR = '{wd / 'state'}'\n")
            return [str(exe), "--config", str(config)]

        with _serving(wd, "sushy-emulator", argv) as peer:
            yield peer


# --- mitmdump fault proxy ---------------------------------------------------------------------------


def parse_rule(rule: str | dict[str, Any]) -> dict[str, Any]:
    """Normalise one rule to the addon's JSON form, validating it here (not silently in the proxy).

    String forms (regex = searched in the path without query string; prefix it with `query:` to search
    the path with its query string):
        "latency <seconds>"                    every request waits first (global)
        "<regex> status <code> [<json body>]"  e.g. "/Systems/1$ status 401", '/Power$ status 503 {"error": {}}'
        "<regex> delay <seconds>"              answered normally after a non-blocking wait
        "<regex> hang [<cap seconds>]"         never answered (dropped after the cap, default 120 s)
        "<regex> reset"                        connection dropped without a response
        "<regex> body <text>"                  200 with a non-JSON body
        "<regex> missing"                      404 with a Redfish error body
    Dicts are passed through with the keys the addon reads: match, action, code, body, headers,
    seconds, query.
    """
    if isinstance(rule, dict):
        out = dict(rule)
    else:
        parts = rule.split(None, 1)
        if len(parts) == 2 and parts[0] == "latency":
            out = {"action": "latency", "seconds": parts[1]}
        else:
            tokens = rule.split(None, 2)
            if len(tokens) < 2:
                raise ValueError(f"fault rule {rule!r}: expected '<regex> <action> [args]' or 'latency <s>'")
            match, action, arg = tokens[0], tokens[1], (tokens[2] if len(tokens) > 2 else "")
            out = {"action": action}
            if match.startswith("query:"):
                match, out["query"] = match[len("query:"):], True
            out["match"] = match
            if action == "status":
                code, _, body = arg.partition(" ")
                out["code"] = code
                if body.strip():
                    out["body"] = json.loads(body)
            elif action in ("delay", "hang"):
                if arg:
                    out["seconds"] = arg
            elif action == "body":
                out["body"] = arg
            elif arg:
                raise ValueError(f"fault rule {rule!r}: {action!r} takes no argument")
    action = str(out.get("action"))
    if action not in ACTIONS:
        raise ValueError(f"fault rule {rule!r}: unknown action {action!r} (one of {', '.join(ACTIONS)})")
    if action != "latency":
        if not isinstance(out.get("match"), str):
            raise ValueError(f"fault rule {rule!r}: needs a 'match' path regex")
        re.compile(out["match"])
    if action == "status":
        out["code"] = int(out["code"])
        if not 100 <= out["code"] <= 599:
            raise ValueError(f"fault rule {rule!r}: bad HTTP status {out['code']}")
    if action in ("delay", "latency") or (action == "hang" and "seconds" in out):
        out["seconds"] = float(out["seconds"])
        if out["seconds"] < 0:
            raise ValueError(f"fault rule {rule!r}: negative seconds")
    return out


@dataclass
class FaultProxy:
    url: str  # point the client here instead of the upstream
    upstream: str
    rules_path: Path
    requests_log: Path
    log_path: Path  # mitmdump's own output
    pid: int
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_rules(self, rules: list[str | dict[str, Any]]) -> None:
        """Replace the rules; they apply from the next request on (the addon re-reads them per request)."""
        parsed = [parse_rule(r) for r in rules]
        with self._lock:
            tmp = self.rules_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(parsed), encoding="utf-8")
            os.replace(tmp, self.rules_path)

    def clear(self) -> None:
        """Remove every rule (pass-through again)."""
        self.set_rules([])

    def request_log(self) -> list[dict[str, Any]]:
        """Every request seen since the last reset, in order: {"method", "path" (with query), "t"}."""
        try:
            text = self.requests_log.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def requests(self, method: str | None = None) -> dict[str, int]:
        """Requests per path (query string included, as sent) since the last reset, faulted ones too."""
        return dict(Counter(e["path"] for e in self.request_log() if method is None or e["method"] == method))

    def reset_requests(self) -> None:
        with open(self.requests_log, "w", encoding="utf-8"):
            pass  # the addon appends with O_APPEND, so truncating is safe while it runs


@contextlib.contextmanager
def fault_proxy(upstream_url: str, workdir: Path | None = None) -> Iterator[FaultProxy]:
    """mitmdump reverse proxy on 127.0.0.1:<free port> in front of `upstream_url`, with the fault addon."""
    exe = peer_bin("mitm", "mitmdump")
    upstream_url = upstream_url.rstrip("/")
    with _workdir("nodewarden-mitm-", workdir) as wd:
        confdir = wd / "mitm-conf"  # mitmproxy would otherwise write its CA into ~/.mitmproxy
        confdir.mkdir(exist_ok=True)
        for attempt in range(3):
            port = free_port()
            rules_path, requests_log = wd / f"rules-{port}.json", wd / f"requests-{port}.jsonl"
            log_path = wd / f"mitmdump-{port}.log"
            rules_path.write_text("[]", encoding="utf-8")
            requests_log.write_text("", encoding="utf-8")
            argv = [
                str(exe), "-q",
                "--mode", f"reverse:{upstream_url}",
                "--listen-host", "127.0.0.1", "--listen-port", str(port),
                "--set", f"confdir={confdir}",
                "--set", "connection_strategy=lazy",  # upstream only after the rules let a request through
                "--set", "ssl_insecure=true",  # an HTTPS upstream with a test certificate
                "-s", str(ADDON),
            ]
            env = {"NODEWARDEN_FAULT_RULES": str(rules_path), "NODEWARDEN_FAULT_LOG": str(requests_log)}
            proc = _spawn(argv, log_path, env)
            url = f"http://127.0.0.1:{port}"
            try:  # the ping is answered by the addon: proves the addon loaded, not only the proxy
                _wait_http(url + PING_PATH, proc, log_path, expect=b"faultproxy-ok")
            except RuntimeError:
                _stop(proc)
                if attempt == 2:
                    raise
                continue
            try:
                yield FaultProxy(url, upstream_url, rules_path, requests_log, log_path, proc.pid)
            finally:
                _stop(proc)
            return


# --- a BMC that accepts and never answers ---------------------------------------------------------


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[str, int]]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never sends a byte."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept_loop, name="silent-listener", daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        server.close()


# --- pytest fixtures ------------------------------------------------------------------------------------


class RedfishPeers:
    """Starts peers on demand; every one of them stops when the owning fixture tears down."""

    def __init__(self, stack: contextlib.ExitStack, tmp: Path) -> None:
        self._stack, self._tmp, self._n = stack, tmp, 0

    def _dir(self, kind: str) -> Path:
        self._n += 1
        return self._tmp / f"{kind}-{self._n}"

    def sushy(self, mockup_dir: Path | str, tls: TlsFiles | None = None) -> RedfishPeer:
        """`mockup_dir`: a path, or a mockup name under fixtures/redfish."""
        path = mockup(mockup_dir) if isinstance(mockup_dir, str) and "/" not in mockup_dir else Path(mockup_dir)
        return self._stack.enter_context(sushy_static(path, tls, workdir=self._dir("sushy")))

    def proxy(self, upstream_url: str) -> FaultProxy:
        return self._stack.enter_context(fault_proxy(upstream_url, workdir=self._dir("mitm")))

    def tls(self, name: str = "bmc") -> TlsFiles:
        return self_signed_tls(self._dir("tls"), name)

    def silent(self) -> tuple[str, int]:
        return self._stack.enter_context(silent_listener())


@pytest.fixture
def redfish_peers(tmp_path: Path) -> Iterator[RedfishPeers]:
    with contextlib.ExitStack() as stack:
        yield RedfishPeers(stack, tmp_path)


@pytest.fixture(scope="module")
def redfish_peers_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishPeers]:
    with contextlib.ExitStack() as stack:
        yield RedfishPeers(stack, tmp_path_factory.mktemp("redfish-peers"))
