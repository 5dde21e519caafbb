"""BIOS enumerations through the BMC's AttributeRegistry, read over HTTP (issue 13 rule 5).

The walk follows `Bios.AttributeRegistry` -> `/redfish/v1/Registries` -> the MessageRegistryFile ->
its `Location[].Uri` (agent/sources/redfish_registry.py), under the walk's own bounds, and
`bios.attribute` matches a value by the registry's ValueName / ValueDisplayName. The BMC is
sushy-static serving fixtures/redfish-registry/lenovo-sr675-registry (hand-written, see its
SOURCES.md): its BIOS reports `OperatingModes_ChooseOperatingMode` by its display name,
"Maximum Performance", which a string compare with the profile's `MaximumPerformance` fails.

Needs the peers venvs from `python -m tests.peers.setup` (the tests fail, not skip, without them).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import NOT_READ, BmcFacts, NodeFacts
from agent.core.model import SourceStatus, Status, Unknown, Unsupported
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import LiveRedfish, RecordedRedfish, RecordingRedfish, Transport, read_redfish
from agent.sources.redfish_registry import MAX_FILES, RegistryChain, name_rank
from checks.bios import BIOS
from tests.conftest import RunCli
from tests.factories import exp, nvml_node, profile
from tests.peers.hostile_redfish import hostile_bmc
from tests.peers.redfish import RedfishPeer, sushy_static

REPO = Path(__file__).resolve().parents[3]
MOCKUP = REPO / "fixtures" / "redfish-registry" / "lenovo-sr675-registry"
V1 = "redfish/v1"
MODE = "OperatingModes_ChooseOperatingMode"
REGISTRY = "/redfish/v1/Systems/1/Bios/BiosRegistry"
FILE = "/redfish/v1/Registries/BiosAttributeRegistry.v1_0_0"
PASSWORD = "r3gistry-Pa55!"


class Logged:
    """A transport that remembers every path the walk asked for."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.asked: list[str] = []
        self._lock = threading.Lock()
        self.supports_expand = bool(getattr(inner, "supports_expand", False))

    @property
    def requests(self) -> int:
        return self.inner.requests

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        with self._lock:
            self.asked.append(path)
        return self.inner.get(path, expand)

    def close(self) -> None:
        self.inner.close()


def live(url: str, **kw: Any) -> tuple[BmcFacts, SourceStatus, Logged]:
    transports: list[Logged] = []

    def make() -> Logged:
        transports.append(Logged(LiveRedfish(url, "admin", PASSWORD, timeout_s=5.0, backoff_s=0.05, **kw)))
        return transports[-1]

    facts, status, _ = read_redfish(make, deadline_s=30.0)
    assert isinstance(facts, BmcFacts), facts
    return facts, status, transports[0]


def node(bmc: BmcFacts) -> NodeFacts:
    facts = nvml_node()
    facts.bmc = bmc
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    return facts


def mode_finding(bmc: BmcFacts, profile: Profile) -> Any:
    (finding,) = [f for f in BIOS.run(node(bmc), profile) if f.subject == MODE]
    return finding


def copy_mockup(tmp: Path) -> Path:
    target = tmp / "bmc"
    shutil.copytree(MOCKUP, target)
    return target


def edit(tree: Path, path: str, change: Any) -> None:
    file = tree / path.lstrip("/") / "index.json"
    body = json.loads(file.read_text(encoding="utf-8"))
    change(body)
    file.write_text(json.dumps(body), encoding="utf-8")


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


@pytest.fixture(scope="module")
def aliased() -> Profile:
    """generic-nvidia with the Lenovo mode's display name as a profile alias (the fallback basis)."""
    return profile({"bios": {"attributes": {"Lenovo": {MODE: exp(
        equals="MaximumPerformance", aliases={"MaximumPerformance": ["Maximum Performance"]})}}}})


@pytest.fixture(scope="module")
def bmc() -> Iterator[RedfishPeer]:
    with sushy_static(MOCKUP) as peer:
        yield peer


# --- (a) live: the chain is followed and the registry's display name matches --------------------------------


def test_live_read_follows_the_registry_chain(bmc: RedfishPeer, generic: Profile) -> None:
    """Fails on the old code: the walk never read /Registries, so `bios_registry` stayed NOT_READ and
    "Maximum Performance" was compared as spelled with MaximumPerformance: fail."""
    facts, status, transport = live(bmc.url)
    assert status.ok and status.error is None, status  # nothing failed, the registry counts as read
    assert {"/redfish/v1/Registries", FILE, REGISTRY} <= set(transport.asked)
    assert "/redfish/v1/Registries/Base.1.15.0" not in transport.asked  # only the file that names the registry
    assert len(transport.asked) == len(set(transport.asked))
    assert isinstance(facts.bios_registry, dict)
    assert facts.bios_registry[MODE]["MaximumPerformance"] == "Maximum Performance"
    finding = mode_finding(facts, generic)
    assert finding.status is Status.PASS, finding.message
    assert finding.observed == "Maximum Performance" and "attribute registry" in finding.message
    # The same BIOS without the registry is judged by the string: the registry made the difference.
    assert mode_finding(facts._replace(bios_registry=NOT_READ), generic).status is Status.FAIL
    # A value the registry does not name as the wanted one still fails, and says what judged it.
    other = facts._replace(bios_attributes={**facts.bios_attributes, MODE: "Efficiency - Favor Performance"})
    failed = mode_finding(other, generic)
    assert failed.status is Status.FAIL and "registry" in failed.message


# --- (b) an off-box or escaping Location is never fetched ---------------------------------------------------


def test_a_hostile_registry_location_is_not_fetched(tmp_path: Path, generic: Profile) -> None:
    tree = copy_mockup(tmp_path)
    with hostile_bmc("normal") as elsewhere:
        hostile = [f"{elsewhere.url}{REGISTRY}",  # another origin
                   f"//{elsewhere.url.split('://', 1)[1]}{REGISTRY}",  # scheme-relative: another origin
                   "/redfish/v1/Registries/../Systems/1/Bios/BiosRegistry",  # .. out of the registry file
                   "/redfish/v1/Registries/%2e%2e/Systems/1/Bios/BiosRegistry",  # the same, encoded
                   "redfish/v1/Systems/1/Bios/BiosRegistry",  # relative to whatever the client thinks
                   "/redfish/v1/Systems/1/Bios/BiosRegistry?$select=RegistryEntries",  # a query
                   "/etc/passwd"]

        def locations(body: dict[str, Any]) -> None:
            body["Location"] = [{"Language": "en", "Uri": uri, "PublicationUri": f"{elsewhere.url}/registry.json",
                                 "ArchiveUri": f"{elsewhere.url}/registries.zip"} for uri in hostile]

        edit(tree, FILE, locations)
        with sushy_static(tree) as peer:
            facts, status, transport = live(peer.url)
        assert elsewhere.requests == []  # neither a PublicationUri nor an off-origin Uri was asked for
    assert not any(".." in p or "%2e" in p.lower() or "?" in p or not p.startswith("/redfish/v1")
                   for p in transport.asked), transport.asked
    assert REGISTRY not in transport.asked  # every Location was refused, so the registry is not read
    assert status.ok and status.error is None  # a refused registry is not a failed BMC read
    assert isinstance(facts.bios_registry, Unknown) and not isinstance(facts.bios_registry, Unsupported)
    assert "refused the registry location" in facts.bios_registry.reason
    finding = mode_finding(facts, generic)
    assert finding.status is Status.FAIL  # no registry, no alias: compared as spelled
    assert "no attribute registry" in finding.message and "refused" in finding.message


def test_location_checks_without_a_server() -> None:
    """The same refusals, through the chain alone (fast), plus the name matching of registry files."""
    from agent.sources.redfish import _checked_path

    chain = RegistryChain(_checked_path)
    root = {"Registries": {"@odata.id": "/redfish/v1/Registries"}}
    bios = {"@odata.type": "#Bios.v1_2_0.Bios", "AttributeRegistry": "BiosAttributeRegistryP89.v1_0_0"}
    assert chain.plan("/redfish/v1/Systems/1/Bios", bios, root) == (False, ["/redfish/v1/Registries"])
    members = [{"@odata.id": f"/redfish/v1/Registries/{name}"} for name in (
        "Base.1.4.0", "BiosAttributeRegistry.v1_0_0", "Messages", "../../Systems", "BiosAttributeRegistry2.v1")]
    replaces, files = chain.plan("/redfish/v1/Registries", {"Members": members * 3}, root)
    assert replaces and files == ["/redfish/v1/Registries/BiosAttributeRegistry.v1_0_0"]  # sushy-tools' naming
    for uri in ("https://bmc.example/redfish/v1/x", "//bmc.example/redfish/v1/x", "/redfish/v1/a/../b",
                "/redfish/v1/a%2fb", "/redfish/v1/a\\b", "/redfish/v1/a?b", "x/redfish/v1/a"):
        assert chain.plan(files[0], {"Location": [{"Uri": uri}]}, root) == (True, []), uri
    assert chain.plan(files[0], {"Location": [{"PublicationUri": "/redfish/v1/ok"}]}, root) == (True, [])
    assert chain.plan(files[0], {"Location": [{"Language": "de", "Uri": "/redfish/v1/de"},
                                              {"Language": "en", "Uri": "/redfish/v1/en"}]}, root) == (
        True, ["/redfish/v1/en"])
    # Matching: exact, another version, a shorter name the Id starts with; never a different registry.
    assert name_rank("BiosAttributeRegistryU58.v1_2_44", "BiosAttributeRegistryU58.v1_2_44") == 0
    assert name_rank("BiosAttributeRegistry", "BiosAttributeRegistry.v1_0_3") == 1
    assert name_rank("BiosAttributeRegistry.v1_0_0", "BiosAttributeRegistryP89.v1_0_0") == 2
    assert name_rank("Base.1.4.0", "BiosAttributeRegistry.v1_0_0") is None
    assert name_rank("Bios", "BiosAttributeRegistry.v1_0_0") is None  # too short to say
    # Fan-out: a collection listing hundreds of look-alikes costs at most MAX_FILES requests.
    flood = RegistryChain(_checked_path)
    flood.plan("/redfish/v1/Systems/1/Bios", bios, root)
    many = {"Members": [{"@odata.id": f"/redfish/v1/Registries/BiosAttributeRegistry.v{i}"} for i in range(500)]}
    assert len(flood.plan("/redfish/v1/Registries", many, root)[1]) == MAX_FILES


# --- (c) no registry, an oversized one, a malformed one: aliases, and the audit goes on ---------------------------


def test_without_a_registry_the_profile_aliases_decide(tmp_path: Path, generic: Profile, aliased: Profile) -> None:
    tree = copy_mockup(tmp_path)
    shutil.rmtree(tree / V1 / "Registries")  # the root still links it: GET /Registries answers 404
    with sushy_static(tree) as peer:
        facts, status, transport = live(peer.url)
    assert "/redfish/v1/Registries" in transport.asked and REGISTRY not in transport.asked
    assert status.ok and status.error is None, status  # the BMC offers no registry: not a failure
    assert isinstance(facts.bios_registry, Unsupported) and "HTTP 404" in facts.bios_registry.reason
    finding = mode_finding(facts, aliased)
    assert finding.status is Status.PASS and "alias" in finding.message
    assert "no attribute registry" in finding.message and "HTTP 404" in finding.message
    assert mode_finding(facts, generic).status is Status.FAIL  # no alias either: the string decides
    # A root that links no Registries is not even asked.
    edit(tree, "/redfish/v1", lambda body: body.pop("Registries"))
    replayed, _, _ = read_redfish(lambda: RecordedRedfish(tree))
    assert isinstance(replayed, BmcFacts) and isinstance(replayed.bios_registry, Unsupported)
    assert "links no Registries" in replayed.bios_registry.reason


def test_an_oversized_registry_is_not_read(tmp_path: Path, aliased: Profile) -> None:
    tree = copy_mockup(tmp_path)
    edit(tree, REGISTRY, lambda body: body.update(Padding="x" * 64_000))
    with sushy_static(tree) as peer:
        facts, status, transport = live(peer.url, max_body_bytes=32_000)  # every other resource is < 2 KB
    assert REGISTRY in transport.asked
    assert status.ok and status.error is None, status
    assert isinstance(facts.bios_registry, Unknown) and "cap" in facts.bios_registry.reason
    assert isinstance(facts.bios_attributes, dict) and facts.bios_attributes[MODE] == "Maximum Performance"
    finding = mode_finding(facts, aliased)
    assert finding.status is Status.PASS and "no attribute registry" in finding.message


@pytest.mark.parametrize(("what", "change", "reason"), [
    ("not JSON", lambda file: file.write_text("{not json", encoding="utf-8"), "unreadable recording"),
    ("no enumerations", lambda file: file.write_text(json.dumps({
        "@odata.type": "#AttributeRegistry.v1_3_8.AttributeRegistry", "Id": "BiosAttributeRegistryTSK.v1_0_0",
        "RegistryEntries": {"Attributes": "all of them"}}), encoding="utf-8"), "no enumeration values"),
    ("another registry", lambda file: file.write_text(json.dumps({
        "@odata.type": "#AttributeRegistry.v1_3_8.AttributeRegistry", "Id": "SomeoneElses.v9_9_9",
        "RegistryEntries": {"Attributes": []}}), encoding="utf-8"), "not the one the BIOS names"),
    ("not a registry", lambda file: file.write_text(json.dumps({"@odata.type": "#Bios.v1_2_0.Bios"}),
                                                    encoding="utf-8"), "is not an AttributeRegistry"),
])
def test_a_malformed_registry_falls_back(tmp_path: Path, aliased: Profile, what: str, change: Any,
                                         reason: str) -> None:
    tree = copy_mockup(tmp_path)
    change(tree / REGISTRY.lstrip("/") / "index.json")
    facts, status, _ = read_redfish(lambda: RecordedRedfish(tree))
    assert isinstance(facts, BmcFacts) and status.ok and status.error is None, (what, status)
    assert isinstance(facts.bios_registry, Unknown) and reason in facts.bios_registry.reason, facts.bios_registry
    finding = mode_finding(facts, aliased)
    assert finding.status is Status.PASS and "no attribute registry" in finding.message


# --- (d) `snapshot capture` records the registry; the replay judges the same ---------------------------------------


def test_the_recorded_snapshot_replays_the_registry(bmc: RedfishPeer, tmp_path: Path, run_cli: RunCli,
                                                    generic: Profile) -> None:
    recorder: list[RecordingRedfish] = []

    def make() -> RecordingRedfish:
        recorder.append(RecordingRedfish(LiveRedfish(bmc.url, "admin", PASSWORD, timeout_s=5)))
        return recorder[0]

    facts, _status, _ = read_redfish(make)
    recording = tmp_path / "recording"
    recorder[0].write(recording)
    assert (recording / REGISTRY.lstrip("/") / "index.json").is_file()
    replayed, _, _ = read_redfish(lambda: RecordedRedfish(recording))
    assert isinstance(facts, BmcFacts) and isinstance(replayed, BmcFacts)
    assert replayed._replace(requests=0) == facts._replace(requests=0)
    assert mode_finding(replayed, generic).message == mode_finding(facts, generic).message

    secret = tmp_path / "bmc-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    out = tmp_path / "snap"
    captured = run_cli("snapshot", "capture", "--out", str(out), "--bmc", bmc.url, "--bmc-user", "admin",
                       "--bmc-password-file", str(secret))
    assert captured.code == 0, captured.stderr
    assert (out / REGISTRY.lstrip("/") / "index.json").is_file()  # the registry is in the snapshot
    assert (out / FILE.lstrip("/") / "index.json").is_file()
    # This machine has no GPU (profile no-nvidia-gpu: no BIOS tuning); judge the BMC as a GPU node would be.
    replay = run_cli("audit", "--snapshot", str(out), "--format", "json", "--only", "bios.*", "--profile",
                     "generic-nvidia")
    assert replay.code in (0, 1), replay.stderr
    (found,) = [f for f in replay.json()["findings"] if f["check"] == "bios.attribute" and f["subject"] == MODE]
    expected = mode_finding(facts, generic)
    assert (found["status"], found["observed"]) == ("pass", "Maximum Performance")
    assert "attribute registry" in found["message"] and found["message"] == expected.message
