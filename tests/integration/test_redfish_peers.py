"""The Redfish test peers (tests/peers/redfish.py) work, seen through the DMTF `redfish` client.

Needs the peers venvs from `python -m tests.peers.setup`; without them these tests fail and say so.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redfish
import requests
from redfish.rest.v1 import InvalidCredentialsError, JsonDecodingError, RetriesExhaustedError
from urllib3.exceptions import InsecureRequestWarning

from tests.peers.redfish import (
    MOCKUPS,
    REPO,
    FaultProxy,
    RedfishPeer,
    RedfishPeers,
    fault_proxy,
    mockup,
    mockup_names,
    parse_rule,
    redfish_peers,
    redfish_peers_module,
    sushy_static,
)

__all__ = ["redfish_peers", "redfish_peers_module"]  # fixtures used below, imported from the harness



def client(url: str, timeout: float = 5, cafile: str | None = None, login: bool = True) -> Any:
    c = redfish.redfish_client(base_url=url, username="u", password="p", default_prefix="/redfish/v1/",
                               timeout=timeout, max_retry=0, cafile=cafile)
    if login:
        c.login(auth="basic")
    return c


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run fn in a thread; the dict gets 'result' or 'error', and 'seconds'."""
    box: dict[str, Any] = {}

    def run() -> None:
        t0 = time.perf_counter()
        try:
            box["result"] = fn()
        except Exception as e:  # noqa: BLE001 -- handed to the test thread
            box["error"] = e
        box["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


# --- every mockup is served -------------------------------------------------------------------------

# mockup -> (a member collection, how many members, its first member)
COLLECTIONS = {
    "gathergpus_happypath": ("/redfish/v1/Systems/HGX_Baseboard_0/Processors", 2, "/redfish/v1/Systems/HGX_Baseboard_0/Processors/CPU_0"),
    "gpu_info_unknown_multi": ("/redfish/v1/Systems/HGX_Baseboard_0/Processors", 3, "/redfish/v1/Systems/HGX_Baseboard_0/Processors/FPGA_0"),
    "hpe-dl380a-gen11": ("/redfish/v1/UpdateService/FirmwareInventory", 34, "/redfish/v1/UpdateService/FirmwareInventory/1"),
    "manager_happypath": ("/redfish/v1/Managers", 1, "/redfish/v1/Managers/BMC"),
    "powershelf_delta": ("/redfish/v1/Chassis", 1, "/redfish/v1/Chassis/PowerShelf_0"),
    "powershelf_liteon": ("/redfish/v1/Chassis", 2, "/redfish/v1/Chassis/PowerShelf_0"),
    "supermicro-x10": ("/redfish/v1/Systems/1/LogServices/Log1/Entries", 65, "/redfish/v1/Systems/1/LogServices/Log1/Entries/1"),
    # issue 13's evidence trees (tests/oracle/test_bmc_evidence.py)
    "hpe-ilo5-dl360-gen10plus": ("/redfish/v1/Systems/1/LogServices/IML/Entries", 142,
                                 "/redfish/v1/Systems/1/LogServices/IML/Entries/1"),
    "cray-ex-cmm-chassis-controller": ("/redfish/v1/Chassis", 17, "/redfish/v1/Chassis/Blade7"),
    "cray-ex420-intel-blade": ("/redfish/v1/Chassis", 5, "/redfish/v1/Chassis/Node0"),
    "cray-ex425-amd-milan-blade": ("/redfish/v1/Chassis", 4, "/redfish/v1/Chassis/Mezz0"),
    "cray-ex4252-amd-genoa-blade": ("/redfish/v1/Chassis", 9, "/redfish/v1/Chassis/Mezz1"),
    "cray-slingshot-switch-blade": ("/redfish/v1/Chassis", 1, "/redfish/v1/Chassis/Enclosure"),
    # issue 31.2: both layouts in one chassis
    "dmtf-public-rackmount1": ("/redfish/v1/Chassis/1U/Sensors", 41, "/redfish/v1/Chassis/1U/Sensors/AmbientTemp"),
}


def test_every_servable_mockup_is_covered() -> None:
    assert mockup_names() == sorted(COLLECTIONS)


@pytest.mark.parametrize("name", sorted(COLLECTIONS))
def test_mockup_serves_root_and_a_collection(name: str, redfish_peers: RedfishPeers) -> None:
    bmc = redfish_peers.sushy(name)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", bmc.url)
    c = client(bmc.url)
    root = c.get("/redfish/v1/")
    assert root.status == 200
    assert root.dict["@odata.id"].rstrip("/") == "/redfish/v1"
    assert root.dict["@odata.type"].startswith("#ServiceRoot.")
    path, count, first = COLLECTIONS[name]
    coll = c.get(path)
    assert coll.status == 200
    members = coll.dict["Members"]
    assert len(members) == count
    assert members[0]["@odata.id"] == first
    if len(members[0]) == 1:  # a bare link: the member itself is served too
        assert c.get(first).dict["@odata.id"] == first


def test_sushy_static_behaves_as_documented(redfish_peers: RedfishPeers) -> None:
    bmc = redfish_peers.sushy(mockup("hpe-dl380a-gen11"))
    c = client(bmc.url)
    assert c.get("/redfish/v1/Systems", args={"$expand": "."}).status == 404  # any query string
    assert c.get("/redfish/v1/DoesNotExist").status == 404
    # iLO writes the Bios link in lower case; sushy-static's file lookup is case-sensitive
    assert c.get("/redfish/v1/Systems/1").dict["Bios"]["@odata.id"] == "/redfish/v1/systems/1/bios"
    assert c.get("/redfish/v1/systems/1/bios").status == 404
    assert c.get("/redfish/v1/Systems/1/bios").dict["Attributes"]["PowerRegulator"] == "DynamicPowerSavings"
    assert c.post("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", body={"ResetType": "On"}).status == 204
    # loopback only, and the request headers (credentials) go to the log file, not to the test output
    listening = {conn.laddr.ip for conn in psutil.Process(bmc.pid).net_connections("tcp") if conn.status == "LISTEN"}
    assert listening == {"127.0.0.1"}
    deadline = time.monotonic() + 5
    while "Authorization: Basic" not in bmc.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.05)
    credentials_logged = "Authorization: Basic" in bmc.log_path.read_text(errors="replace")
    assert credentials_logged


def test_missing_peers_venv_fails_with_the_setup_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NODEWARDEN_PEERS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match=r"tests\.peers\.setup"), sushy_static(mockup("manager_happypath")):
        pass
    with pytest.raises(pytest.fail.Exception, match=r"tests\.peers\.setup"), fault_proxy("http://127.0.0.1:9"):
        pass


def test_peers_stop_with_their_context() -> None:
    with sushy_static(mockup("manager_happypath")) as bmc, fault_proxy(bmc.url) as px:
        procs = [psutil.Process(bmc.pid), psutil.Process(px.pid)]
        assert all(p.is_running() for p in procs)
        assert client(px.url).get("/redfish/v1/Managers/BMC").dict["FirmwareVersion"] == "2.10.0"
    for p in procs:
        with pytest.raises(psutil.NoSuchProcess):
            p.status()


# --- the fault proxy -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hpe(redfish_peers_module: RedfishPeers) -> RedfishPeer:
    return redfish_peers_module.sushy("hpe-dl380a-gen11")


@pytest.fixture(scope="module")
def shared_proxy(redfish_peers_module: RedfishPeers, hpe: RedfishPeer) -> FaultProxy:
    return redfish_peers_module.proxy(hpe.url)


@pytest.fixture
def proxy(shared_proxy: FaultProxy) -> Iterator[FaultProxy]:
    shared_proxy.clear()
    shared_proxy.reset_requests()
    yield shared_proxy
    shared_proxy.clear()


def test_proxy_passes_through_counts_and_binds_loopback(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    assert c.get("/redfish/v1/Systems/1").dict["Model"].startswith("ProLiant DL380a Gen11")
    c.get("/redfish/v1/Systems/1")
    c.get("/redfish/v1/Managers/1")
    c.get("/redfish/v1/Systems", args={"$expand": "."})
    counts = proxy.requests()
    assert counts["/redfish/v1/Systems/1"] == 2
    assert counts["/redfish/v1/Managers/1"] == 1
    assert counts["/redfish/v1/Systems?$expand=."] == 1
    assert counts["/redfish/v1/"] == 1  # the client constructor's GET
    assert proxy.requests(method="POST") == {}
    listening = {conn.laddr.ip for conn in psutil.Process(proxy.pid).net_connections("tcp") if conn.status == "LISTEN"}
    assert listening == {"127.0.0.1"}


def test_status_401_is_answered_once_and_not_retried(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    proxy.set_rules(["/redfish/v1/Systems/1$ status 401"])
    r = c.get("/redfish/v1/Systems/1")
    assert r.status == 401
    assert r.dict["error"]["code"] == "Base.1.8.NoValidSession"
    assert r.getheader("WWW-Authenticate") == 'Basic realm="Redfish"'
    assert proxy.requests()["/redfish/v1/Systems/1"] == 1
    # the basic-auth login validates with a GET of the sessions URL: a 401 there is bad credentials
    proxy.set_rules(["/SessionService/Sessions$ status 401"])
    c2 = client(proxy.url, login=False)
    with pytest.raises(InvalidCredentialsError):
        c2.login(auth="basic")
    assert proxy.requests()["/redfish/v1/SessionService/Sessions"] == 2  # one per login, no retry


def test_status_503_with_a_json_body_and_500_with_the_default_body(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    proxy.set_rules([
        '/Chassis/1/Thermal$ status 503 {"error": {"code": "Base.1.8.ServiceTemporarilyUnavailable", "message": "busy"}}',
        {"match": "/Chassis/1/Power$", "action": "status", "code": 500, "headers": {"Retry-After": "3"}},
    ])
    r = c.get("/redfish/v1/Chassis/1/Thermal")
    assert (r.status, r.dict) == (503, {"error": {"code": "Base.1.8.ServiceTemporarilyUnavailable", "message": "busy"}})
    r = c.get("/redfish/v1/Chassis/1/Power")
    assert r.status == 500
    assert r.getheader("Retry-After") == "3"
    assert r.dict["error"]["@Message.ExtendedInfo"][0]["MessageId"] == "Base.1.8.GeneralError"
    proxy.clear()
    assert c.get("/redfish/v1/Chassis/1/Thermal").status == 200


def test_delay_holds_one_path_and_not_the_others(proxy: FaultProxy) -> None:
    slow, fast = client(proxy.url), client(proxy.url)
    proxy.set_rules(["/Managers/1$ delay 1"])
    thread, box = in_thread(lambda: slow.get("/redfish/v1/Managers/1"))
    time.sleep(0.1)  # the delayed request is in flight
    r, seconds = timed(lambda: fast.get("/redfish/v1/Systems/1"))
    assert r.status == 200
    assert seconds < 0.5
    thread.join(timeout=10)
    assert "error" not in box
    assert box["result"].status == 200  # forwarded after the delay
    assert box["seconds"] >= 1.0


def test_hang_never_answers_that_path_while_others_answer(proxy: FaultProxy) -> None:
    hung, other = client(proxy.url, timeout=2), client(proxy.url)
    proxy.set_rules(["/Chassis/1/Thermal$ hang"])
    thread, box = in_thread(lambda: hung.get("/redfish/v1/Chassis/1/Thermal"))
    time.sleep(0.2)
    r, seconds = timed(lambda: other.get("/redfish/v1/Chassis/1/Power"))
    assert r.status == 200
    assert seconds < 0.5
    thread.join(timeout=10)
    assert isinstance(box.get("error"), RetriesExhaustedError)
    assert isinstance(box["error"].__cause__, requests.exceptions.ReadTimeout)
    assert box["seconds"] >= 1.9
    assert proxy.requests()["/redfish/v1/Chassis/1/Thermal"] == 1


def test_reset_drops_the_connection(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    proxy.set_rules(["/Systems/1$ reset"])
    with pytest.raises(RetriesExhaustedError) as e:
        c.get("/redfish/v1/Systems/1")
    assert isinstance(e.value.__cause__, requests.exceptions.ConnectionError)
    assert proxy.requests()["/redfish/v1/Systems/1"] == 1
    assert c.get("/redfish/v1/Systems").status == 200  # other paths unaffected


def test_body_and_missing(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    proxy.set_rules(["/Chassis/1/Power$ body not-json", "/Systems/1$ missing"])
    r = c.get("/redfish/v1/Chassis/1/Power")
    assert (r.status, r.text) == (200, "not-json")
    with pytest.raises(JsonDecodingError, match="invalid JSON"):
        r.dict  # noqa: B018
    r = c.get("/redfish/v1/Systems/1")  # exists upstream
    assert r.status == 404
    assert r.dict["error"]["code"] == "Base.1.8.ResourceMissingAtURI"


def test_rules_ignore_the_query_string_unless_asked(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    proxy.set_rules(["/redfish/v1/Systems$ status 503"])
    assert c.get("/redfish/v1/Systems", args={"$expand": "."}).status == 503
    proxy.set_rules([r"query:\$expand=\. status 501"])
    assert c.get("/redfish/v1/Systems", args={"$expand": "."}).status == 501
    assert c.get("/redfish/v1/Systems").status == 200


def test_latency_applies_to_every_request_and_overlaps(proxy: FaultProxy) -> None:
    clients = [client(proxy.url) for _ in range(8)]
    paths = ["/redfish/v1/Systems/1", "/redfish/v1/Managers/1", "/redfish/v1/Chassis/1", "/redfish/v1/Chassis/1/Power",
             "/redfish/v1/Chassis/1/Thermal", "/redfish/v1/UpdateService", "/redfish/v1/Systems/1/bios", "/redfish/v1/Managers"]
    proxy.set_rules(["latency 0.1"])
    t0 = time.perf_counter()
    started = [in_thread(lambda c=c, p=p: c.get(p)) for c, p in zip(clients, paths, strict=True)]
    for thread, _ in started:
        thread.join(timeout=10)
    total = time.perf_counter() - t0
    boxes = [box for _, box in started]
    assert all(box["result"].status == 200 for box in boxes), boxes
    assert min(box["seconds"] for box in boxes) >= 0.1
    assert total < 0.45, f"8 concurrent GETs at 0.1 s latency took {total:.2f} s"


def test_parse_rule_validates_in_the_test_process() -> None:
    assert parse_rule("latency 0.25") == {"action": "latency", "seconds": 0.25}
    assert parse_rule("/Thermal$ status 503") == {"action": "status", "match": "/Thermal$", "code": 503}
    assert parse_rule("/x hang") == {"action": "hang", "match": "/x"}
    assert parse_rule("/x body <html>oops</html>")["body"] == "<html>oops</html>"
    assert parse_rule(r"query:\$top status 400")["query"] is True
    for bad in ("/x explode", "/x status 99", "/x status abc", "/x delay -1", "/x reset now", "([ missing", "onlyone"):
        with pytest.raises((ValueError, re.error)):
            parse_rule(bad)


# --- TLS and the silent BMC ----------------------------------------------------------------------------------


def test_tls_peer_is_verified_only_with_its_ca(redfish_peers: RedfishPeers) -> None:
    tls, stranger = redfish_peers.tls("bmc"), redfish_peers.tls("stranger")
    bmc = redfish_peers.sushy("supermicro-x10", tls=tls)
    assert bmc.url.startswith("https://127.0.0.1:")
    root = bmc.url + "/redfish/v1/"
    # verification on, with the CA: accepted (and no InsecureRequestWarning)
    assert requests.get(root, verify=str(tls.ca), timeout=5).status_code == 200
    c = client(bmc.url, cafile=str(tls.ca))
    assert c.get("/redfish/v1/Managers/1").dict["FirmwareVersion"] == "4.0"
    # verification on, without its CA: the handshake fails
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(root, timeout=5)  # requests' default: verify=True against the system/certifi bundle
    with pytest.raises(RetriesExhaustedError) as e:
        client(bmc.url, cafile=str(stranger.ca))
    assert isinstance(e.value.__cause__, requests.exceptions.SSLError)
    # the DMTF client without cafile does not verify at all: it connects and only warns
    with pytest.warns(InsecureRequestWarning):
        assert client(bmc.url).get("/redfish/v1/Systems/1").status == 200


def test_silent_listener_times_out_within_the_client_timeout(redfish_peers: RedfishPeers) -> None:
    host, port = redfish_peers.silent()
    t0 = time.perf_counter()
    with pytest.raises(RetriesExhaustedError) as e:
        client(f"http://{host}:{port}", timeout=1, login=False)
    elapsed = time.perf_counter() - t0
    assert isinstance(e.value.__cause__, requests.exceptions.ReadTimeout)
    assert 0.9 <= elapsed < 1.8


# --- provenance of the mockups -----------------------------------------------------------------------------


def test_every_redfish_fixture_has_a_sources_row_and_license() -> None:
    rows = [line for line in (MOCKUPS / "SOURCES.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `") and "](https://github.com/" in line]
    patterns = {}
    for row in rows:
        rel = row.split("`")[1]
        repo = row.split("[", 1)[1].split("]", 1)[0]
        patterns[rel] = repo
        assert (REPO / "fixtures" / "LICENSES" / (repo.replace("/", "_") + ".txt")).is_file(), row
    on_disk = sorted(str(p.relative_to(MOCKUPS)) for p in MOCKUPS.rglob("*") if p.is_file())
    on_disk.remove("SOURCES.md")
    covered = {rel: [pat for pat in patterns if rel == pat or (pat.endswith("/**") and rel.startswith(pat[:-2]))]
               for rel in on_disk}
    assert [rel for rel, pats in covered.items() if len(pats) != 1] == []
    assert {p for pats in covered.values() for p in pats} == set(patterns)  # no row without files
    # Byte-identity with the reference data is checked by fixtures/tools/check_provenance.py in .ci/run.
