"""Remembered schema passes (agent.io.yamlfile `validation`, profiles): a pass is reused only for the same
content, schema and validator code, and an entry that could be damaged or forged is never taken for one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.digest import sha256_hex
from agent.core.errors import ProfileError
from agent.io import schema, yamlfile
from agent.io.yamlfile import LineMap
from agent.policy import profiles

REPO = Path(__file__).resolve().parents[3]


class Counting:
    """A check that counts its runs and refuses documents holding `bad: true`."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, doc: Any, lines: LineMap) -> None:
        self.runs += 1
        if isinstance(doc, dict) and doc.get("bad"):
            raise ProfileError("bad document", line=lines.line_for(("bad",)))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    return path


def valid_entries(cache_home: Path) -> list[Path]:
    return sorted(p for p in cache_home.iterdir() if p.name.startswith("valid-"))


def test_a_pass_is_remembered_for_the_same_content_and_fingerprint(cache_home: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nb: [x, y]\n")
    check = Counting()
    first = yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    second = yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    assert check.runs == 1 and second == first and second[1].line_for(("b", 1)) == 2
    (entry,) = valid_entries(cache_home)
    assert oct(entry.stat().st_mode & 0o777) == "0o600"


def test_another_fingerprint_or_content_is_checked_again(cache_home: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n")
    check = Counting()
    yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    yamlfile.load_yaml_file(path, ProfileError, validation=("schema-2", check))  # schema or code changed
    assert check.runs == 2
    path.write_text("bad: true\n")
    with pytest.raises(ProfileError, match="bad document"):
        yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))


def test_a_failed_check_is_never_remembered(cache_home: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nbad: true\n")
    check = Counting()
    for _ in range(2):
        with pytest.raises(ProfileError) as info:
            yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
        assert info.value.line == 2
    assert check.runs == 2 and not valid_entries(cache_home)


def remembered(cache_home: Path, tmp_path: Path) -> tuple[Path, Path, Counting]:
    path = write(tmp_path, "role: honest\n")
    check = Counting()
    yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    (entry,) = valid_entries(cache_home)
    return path, entry, check


@pytest.mark.parametrize("damage", ["truncated", "altered", "not json", "no digest line", "empty"])
def test_a_damaged_entry_is_not_taken_for_a_pass(cache_home: Path, tmp_path: Path, damage: str) -> None:
    path, entry, check = remembered(cache_home, tmp_path)
    digest, _, body = entry.read_text().partition("\n")
    forged = json.dumps({"value": {"role": "forged", "bad": True}, "lines": [[["role"], 1], [["bad"], 1]]})
    entry.write_text({
        "truncated": f"{digest}\n{body[:-5]}",
        "altered": f"{digest}\n{forged}",  # what a pass was not given for
        "not json": f"{sha256_hex(b'{nope')}\n{{nope",
        "no digest line": body,
        "empty": "",
    }[damage])
    value, _lines = yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    assert value == {"role": "honest"} and check.runs == 2


def test_an_entry_others_can_write_or_own_is_ignored(cache_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path, entry, check = remembered(cache_home, tmp_path)
    entry.chmod(0o666)
    yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    assert check.runs == 2
    entry.chmod(0o600)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1000)
    yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    assert check.runs == 3


def test_no_cache_checks_every_time(cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEWARDEN_NO_CACHE", "1")
    path = write(tmp_path, "a: 1\n")
    check = Counting()
    for _ in range(2):
        yamlfile.load_yaml_file(path, ProfileError, validation=("schema-1", check))
    assert check.runs == 2 and not cache_home.exists()


# --- profiles -------------------------------------------------------------------------------------


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_home: Path) -> Iterator[Path]:
    """A copy of the shipped profile folder (schema included) that a test may edit, fresh caches."""
    folder = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", folder)
    monkeypatch.setattr(profiles, "shipped_profile_dir", lambda: folder)
    monkeypatch.setattr(profiles, "SITE_PROFILE_DIR", tmp_path / "no-site")
    caches = (profiles.profile_validator, profiles.schema_fingerprint)
    for cached in caches:
        cached.cache_clear()
    yield folder
    for cached in caches:  # the originals: a test may have replaced one
        cached.cache_clear()


def new_process() -> None:
    """What a new run starts with: no validator and no fingerprint computed yet."""
    profiles.profile_validator.cache_clear()
    profiles.schema_fingerprint.cache_clear()


def test_a_profile_seen_before_is_not_validated_again(shipped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {name: profiles.ProfileStore().file(name).data for name in profiles.ProfileStore().names()}
    new_process()

    def no_validator() -> None:
        raise AssertionError("the validator was built although every file passed before")

    monkeypatch.setattr(profiles, "profile_validator", no_validator)
    store = profiles.ProfileStore()
    assert {name: store.file(name).data for name in store.names()} == before
    assert store.profile("hgx-h100-sxm").expectation("sysctl", "vm.zone_reclaim_mode") is not None


def test_a_schema_change_voids_remembered_passes(shipped: Path) -> None:
    site = shipped / "site-box.yaml"
    site.write_text("name: site-box\ndescription: x\nextends: base\n")
    assert profiles.ProfileStore().file("site-box").data["description"] == "x"
    new_process()
    doc = json.loads((shipped / "schema.json").read_text())
    doc["properties"]["description"]["minLength"] = 2  # the site profile no longer passes
    (shipped / "schema.json").write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="description") as info:
        profiles.ProfileStore().file("site-box")
    assert info.value.path == str(site) and info.value.line == 2


def test_the_fingerprint_follows_the_validator_code(shipped: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    first = profiles.schema_fingerprint()
    edited = tmp_path / "schema.py"
    edited.write_text(Path(str(schema.__file__)).read_text() + "\n# changed\n")
    monkeypatch.setattr(schema, "__file__", str(edited))
    new_process()
    assert first is not None and profiles.schema_fingerprint() not in (None, first)
    edited.unlink()  # unreadable code: nothing is remembered, files are validated
    new_process()
    assert profiles.schema_fingerprint() is None
    assert profiles.ProfileStore().file("base").name == "base"
