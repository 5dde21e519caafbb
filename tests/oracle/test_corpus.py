"""The oracle (issue 13): every real capture in fixtures/ and what an SRE concludes from it.

`fixtures/expect/MANIFEST.yaml` lists every real capture copied into fixtures/ (one entry per dump,
log or Redfish tree; `fixtures/tools/check_provenance.py` maps each to the reference data). Each
has `fixtures/expect/<capture>.yaml`: the SRE's one-line reading, whether the capture is healthy, and
for the kinds nodewarden ingests today the conclusions that are not a pass (check, subject, status,
severity, action, each with its reason), the checks that skip, the profile and the exit code. The
audit must conclude exactly that; a capture the importer rightly refuses has `refused:` (the message).
Kinds without an importer (ipmicfg, smartctl, lsblk, ethtool -m, ...) are `not-ingested`: their
reading is the oracle a future importer is tested against.

Captures are audited the way a support engineer does: `nodewarden snapshot import-nvidia-smi` then
`nodewarden audit --snapshot` for dumps; `nodewarden snapshot import FILE` then `audit --snapshot`
for the kinds `snapshot import` reads (IMPORTED: lspci, dmidecode, ibstat/ibstatus, ipmitool
sensor/sdr/sel/dcmi outputs, `nvidia-smi nvlink -s`, `nvidia-smi --query-gpu` CSV, lsmod, `ethtool IF`;
the strict `snapshot import-nvidia-smi` alias still refuses the two nvidia-smi ones by name); a snapshot holding only `kmsg.txt` for kernel logs; a
BMC-only snapshot holding `redfish/` for Redfish trees (collections a mockup held back, listed in
its `_omitted_paths.txt`, are rebuilt from their members, as the BMC would have answered them).
Fabric Manager's log is judged by fabric.sxid directly: `audit` runs that check only with a kernel log.
Each capture is audited once per session.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.core.facts import FabricFacts, NodeFacts
from agent.core.model import Unsupported
from agent.policy.profiles import ProfileStore
from agent.sources.fabric import read_fm_log
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.host import absent_host_facts
from checks.fabric import SXID

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
EXPECT = FIXTURES / "expect"
MANIFEST = EXPECT / "MANIFEST.yaml"
IMPORTED = ("lspci", "dmidecode", "ibstat", "ibstatus", "ipmitool-sensor", "ipmitool-sel", "ipmitool-sdr",
            "ipmitool-dcmi", "nvidia-smi-nvlink", "nvidia-smi-query-csv", "lsmod",
            "ethtool")  # through `snapshot import` (agent/sources/importers/bundle.py)
# nvidia-smi outputs `snapshot import` reads but the strict `snapshot import-nvidia-smi` alias refuses by name
ALIAS_REFUSES = {"nvidia-smi-nvlink": "it is `nvidia-smi nvlink` output",
                 "nvidia-smi-query-csv": "it looks like CSV (`nvidia-smi --query-gpu`)"}
INGESTED = ("nvidia-smi-q", "nvidia-smi-xml", "kernel-log", "fabric-manager-log", "redfish-tree", *IMPORTED)
CONCLUSIONS = ("warn", "fail", "unknown")  # listed one by one; skips are listed per check
ENTRY_KEYS = {"check", "subject", "status", "severity", "action", "reason", "certainty", "note"}
FILE_KEYS = {"capture", "original", "kind", "status", "certainty", "healthy", "reading", "note", "audit", "findings",
             "skipped", "refused"}

Conclusion = tuple[str, str, str, str, str | None]  # check, subject, status, severity, action


@functools.cache
def provenance() -> ModuleType:
    """fixtures/tools/check_provenance.py: the mapping of fixture paths to the reference data (no I/O)."""
    spec = importlib.util.spec_from_file_location("check_provenance", FIXTURES / "tools" / "check_provenance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def manifest() -> dict[str, Any]:
    data = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and set(data) == {"ignore", "captures"}
    return data


def captures() -> dict[str, str]:
    """capture (path under fixtures/) -> kind."""
    out: dict[str, str] = {}
    for entry in manifest()["captures"]:
        assert set(entry) == {"capture", "kind"}, entry
        assert entry["capture"] not in out, f"listed twice: {entry['capture']}"
        out[entry["capture"]] = entry["kind"]
    return out


def ingested() -> list[str]:
    return [c for c, kind in captures().items() if kind in INGESTED]


@functools.cache
def expectation(capture: str) -> dict[str, Any]:
    data = yaml.safe_load((EXPECT / f"{capture}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict), capture
    return data


def expected_conclusions(exp: dict[str, Any]) -> set[Conclusion]:
    out: set[Conclusion] = set()
    for entry in exp.get("findings") or []:
        subjects = entry["subject"] if isinstance(entry["subject"], list) else [entry["subject"]]
        for subject in subjects:
            out.add((entry["check"], str(subject), entry["status"], entry["severity"], entry.get("action")))
    return out


# --- running a capture ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    code: int
    profile: str | None = None
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str = ""

    def conclusions(self) -> set[Conclusion]:
        return {(f["check"], f["subject"], f["status"], f["severity"], f.get("action"))
                for f in self.findings if f["status"] in CONCLUSIONS}

    def skipped(self) -> set[str]:
        return {f["check"] for f in self.findings if f["status"] == "skip"}


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _audit(snapshot: Path, config: Path) -> Outcome:
    code, out, err = _cli("audit", "--config", str(config), "--snapshot", str(snapshot), "--format", "json")
    if code not in (0, 1):
        return Outcome(code, error=err.strip())
    report = json.loads(out)
    return Outcome(code, report["profile"], report["findings"], err.strip())


def _meta(snapshot: Path, captured: str, when: str) -> None:
    (snapshot / "meta.yaml").write_text(
        f"hostname: corpus\ncaptured_at: '{when}'\nnodewarden_version: corpus\ncaptured: [{captured}]\n",
        encoding="utf-8")


def _redfish_snapshot(tree: Path, snapshot: Path, when: str) -> None:
    """The tree as a BMC-only snapshot; collections the mockup held back are rebuilt from their members."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(tree / "redfish", snapshot / "redfish", copy_function=link)
    listed = tree / "_omitted_paths.txt"
    for line in listed.read_text(encoding="utf-8").splitlines() if listed.is_file() else ():
        rel = line.split("\t", 1)[0]
        folder = (snapshot / rel).parent
        if line.startswith("#") or not rel.endswith("/index.json") or (snapshot / rel).exists() or not folder.is_dir():
            continue
        path = "/" + folder.relative_to(snapshot).as_posix()
        members = [{"@odata.id": f"{path}/{m.name}"} for m in sorted(folder.iterdir()) if (m / "index.json").is_file()]
        if members:
            (snapshot / rel).write_text(json.dumps({"@odata.id": path, "@odata.type": "#Collection.Collection",
                                                    "Members": members, "Members@odata.count": len(members)}),
                                        encoding="utf-8")
    _meta(snapshot, "redfish", when)


def _fabric_manager_log(log: Path, work: Path, exp: dict[str, Any]) -> Outcome:
    """fabric.sxid on Fabric Manager's log alone, read through the host reader from a snapshot's fs/."""
    (work / "fs" / "var" / "log").mkdir(parents=True)
    shutil.copyfile(log, work / "fs" / "var" / "log" / "fabricmanager.log")
    errors, read, size = read_fm_log(SnapshotFs(work))
    host = dataclasses.replace(absent_host_facts("not in this capture (a Fabric Manager log only)"),
                               fabric=FabricFacts(log_errors=errors, log_read_bytes=read, log_size=size))
    when = dt.datetime.fromisoformat(exp["audit"]["captured_at"])
    facts = NodeFacts(host=host, kmsg=Unsupported("not in this capture"), observed_at=when)
    profile = ProfileStore().profile(exp["audit"]["profile"])
    findings = [f.to_json() for f in SXID.run(facts, profile)]
    failed = any(f["status"] == "fail" for f in findings)
    return Outcome(1 if failed else 0, profile.name, findings)


def run_capture(capture: str, kind: str, work: Path, config: Path) -> Outcome:
    source = FIXTURES / capture
    exp = expectation(capture)
    work.mkdir(parents=True)
    if kind in ("nvidia-smi-q", "nvidia-smi-xml"):
        snapshot = work / "snapshot"
        code, out, err = _cli("snapshot", "import-nvidia-smi", str(source), "--out", str(snapshot))
        if code != 0:
            return Outcome(code, error=(out + err).strip())
        return _audit(snapshot, config)
    if kind == "kernel-log":
        shutil.copyfile(source, work / "kmsg.txt")
        _meta(work, "kmsg", exp["audit"]["captured_at"])
        return _audit(work, config)
    if kind == "redfish-tree":
        _redfish_snapshot(source, work, exp["audit"]["captured_at"])
        return _audit(work, config)
    if kind == "fabric-manager-log":
        return _fabric_manager_log(source, work, exp)
    if kind in IMPORTED:
        snapshot = work / "snapshot"
        code, out, err = _cli("snapshot", "import", str(source), "--out", str(snapshot))
        if code != 0:
            return Outcome(code, error=(out + err).strip())
        return _audit(snapshot, config)
    raise AssertionError(f"{capture}: no runner for kind {kind}")


@pytest.fixture(scope="session")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Outcome]:
    base = tmp_path_factory.mktemp("corpus")
    config = base / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    done: dict[str, Outcome] = {}
    kinds = captures()

    def get(capture: str) -> Outcome:
        if capture not in done:
            done[capture] = run_capture(capture, kinds[capture], base / str(len(done)), config)
        return done[capture]

    return get


# --- the manifest covers every real capture ------------------------------------------------------------


def copied_files() -> Iterator[str]:
    """Every file in fixtures/ that is a copy of the reference data (check_provenance's mapping)."""
    prov = provenance()
    for path in sorted(FIXTURES.rglob("*")):
        rel = path.relative_to(FIXTURES).as_posix()
        if path.is_file() and path.name not in prov.OURS and prov.original_of(rel) is not None:
            yield rel


def test_every_copied_real_file_is_covered_by_the_manifest() -> None:
    listed = captures()
    ignored = [entry["prefix"] for entry in manifest()["ignore"]]
    assert all(entry.get("why") for entry in manifest()["ignore"])
    uncovered = [rel for rel in copied_files()
                 if rel not in listed and not any(rel.startswith(c.rstrip("/") + "/") for c in listed)
                 and not any(rel.startswith(prefix) for prefix in ignored)]
    assert uncovered == [], f"real files no capture in fixtures/expect/MANIFEST.yaml covers: {uncovered}"
    for capture in listed:
        assert (FIXTURES / capture).exists(), f"manifest names a capture that is not in fixtures/: {capture}"
        assert provenance().original_of(capture if (FIXTURES / capture).is_file() else capture + "/x") is not None, \
            f"{capture} is not a copy of the reference data (fixtures/tools/check_provenance.py COPIES)"
        nested = [c for c in listed if c != capture and c.startswith(capture.rstrip("/") + "/")]
        assert nested == [], f"{capture} holds other captures: {nested}"


def test_every_capture_has_exactly_one_expectation_file() -> None:
    files = {p.relative_to(EXPECT).as_posix()[:-len(".yaml")] for p in EXPECT.rglob("*.yaml") if p != MANIFEST}
    assert files == set(captures())


@pytest.mark.parametrize("capture", sorted(captures()))
def test_expectation_is_well_formed(capture: str) -> None:
    exp = expectation(capture)
    kind = captures()[capture]
    assert set(exp) <= FILE_KEYS, set(exp) - FILE_KEYS
    prov = provenance()
    original = prov.original_of(capture) if (FIXTURES / capture).is_file() else prov.original_of(capture + "/")
    assert (exp["capture"], exp["original"].rstrip("/"), exp["kind"]) == (capture, original.rstrip("/"), kind)
    assert exp["status"] == ("ingested" if kind in INGESTED else "not-ingested")
    assert exp["certainty"] in ("data", "judgement") and isinstance(exp["healthy"], bool)
    assert isinstance(exp["reading"], str) and exp["reading"].strip() and "\n" not in exp["reading"].strip()
    if exp["certainty"] == "judgement" or "note" in exp:
        assert isinstance(exp.get("note"), str) and exp["note"].strip(), "a judgement says why"
    if exp["status"] == "not-ingested":
        assert not {"audit", "findings", "skipped"} & set(exp), "a capture nodewarden cannot read has no findings"
        return
    if "refused" in exp:
        assert not {"audit", "findings", "skipped"} & set(exp), "a refused capture has no findings"
        return
    audit = exp["audit"]
    assert set(audit) <= {"captured_at", "profile", "exit"} and audit["exit"] in (0, 1) and audit["profile"]
    if kind in ("kernel-log", "redfish-tree", "fabric-manager-log"):  # events are judged as of the capture
        dt.datetime.fromisoformat(audit["captured_at"])
    for entry in exp.get("findings") or []:
        assert set(entry) <= ENTRY_KEYS and {"check", "subject", "status", "severity", "reason"} <= set(entry), entry
        assert entry["status"] in CONCLUSIONS and entry["severity"] in ("info", "warning", "critical"), entry
        assert isinstance(entry["reason"], str) and "\n" not in entry["reason"].strip(), entry
        assert entry.get("certainty", "data") in ("data", "judgement"), entry
        if entry.get("certainty") == "judgement":
            assert entry.get("note"), f"a judgement says why: {entry}"
    assert all(isinstance(why, str) and why for why in (exp.get("skipped") or {}).values())


# --- the audit concludes what the SRE reads --------------------------------------------------------------


@pytest.mark.parametrize("capture", ingested())
def test_the_audit_concludes_what_the_sre_reads(capture: str, audited: Callable[[str], Outcome]) -> None:
    exp = expectation(capture)
    outcome = audited(capture)
    if "refused" in exp:  # a dump nodewarden must refuse with one clear message, never a traceback
        assert outcome.code == 2 and exp["refused"] in outcome.error, outcome.error
        assert "Traceback" not in outcome.error
        return
    assert outcome.code in (0, 1), outcome.error
    subjects = [(f["check"], f["subject"]) for f in outcome.findings]
    assert len(subjects) == len(set(subjects)), "one finding per check and subject"
    assert sorted(outcome.conclusions() - expected_conclusions(exp)) == [], "concluded, but not what the SRE reads"
    assert sorted(expected_conclusions(exp) - outcome.conclusions()) == [], "the SRE reads it, the audit misses it"
    assert outcome.skipped() == set(exp.get("skipped") or {}), "the checks that could not judge"
    assert (outcome.profile, outcome.code) == (exp["audit"]["profile"], exp["audit"]["exit"])
    if exp["healthy"]:
        critical = [f["message"] for f in outcome.findings if f["status"] == "fail" and f["severity"] == "critical"]
        assert critical == [], "a capture marked healthy has no critical fail"


@pytest.mark.parametrize("capture", [c for c in sorted(captures()) if c.startswith("nvidia-smi/")
                                     and (captures()[c] not in INGESTED or captures()[c] in ALIAS_REFUSES)])
def test_nvidia_smi_outputs_that_are_not_dumps_are_refused_by_name(capture: str, tmp_path: Path) -> None:
    """`snapshot import-nvidia-smi` takes `-q` dumps only: tables, `nvidia-smi nvlink` and `--query-gpu` output
    get one clear refusal that names what they are, never a half-judged node (`snapshot import` reads the last two)."""
    kind = captures()[capture]
    refused = ["not an nvidia-smi -q dump", ALIAS_REFUSES[kind]] if kind in ALIAS_REFUSES else \
        [expectation(capture)["refused"]]
    code, out, err = _cli("snapshot", "import-nvidia-smi", str(FIXTURES / capture), "--out", str(tmp_path / "s"))
    assert code == 2 and all(r in err for r in refused) and "Traceback" not in err + out, err
    assert not (tmp_path / "s").exists()
