"""The YAML parse cache: same answers as parsing, never trusted when it could be forged."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agent.core.errors import ProfileError
from agent.io import yamlfile


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    return path


def test_second_load_comes_from_the_cache_without_pyyaml(cache_home: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "a: 1\nb:\n  - x\n  - when: 2026-01-02\n")
    first = yamlfile.load_yaml_file(path)
    entries = list(cache_home.iterdir())
    assert len(entries) == 1 and oct(entries[0].stat().st_mode & 0o777) == "0o600"
    assert oct(cache_home.stat().st_mode & 0o777) == "0o700"
    monkeypatch.setitem(sys.modules, "yaml", None)  # importing PyYAML now would fail
    second = yamlfile.load_yaml_file(path)
    assert second == first
    assert second[0] == {"a": 1, "b": ["x", {"when": "2026-01-02"}]}
    assert second[1].line_for(("b", 1, "when")) == 4


def test_changed_content_is_parsed_again(cache_home: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n")
    assert yamlfile.load_yaml_file(path)[0] == {"a": 1}
    path.write_text("a: 2\n")  # same size, same second: the key is the content, not the mtime
    assert yamlfile.load_yaml_file(path)[0] == {"a": 2}


def test_errors_are_never_cached(cache_home: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "a: [1\n")
    for _ in range(2):
        with pytest.raises(ProfileError) as info:
            yamlfile.load_yaml_file(path, ProfileError)
        assert info.value.line == 2
    assert not cache_home.exists() or not list(cache_home.iterdir())


def poisoned(cache_home: Path, tmp_path: Path) -> tuple[Path, Path]:
    path = write(tmp_path, "role: honest\n")
    yamlfile.load_yaml_file(path)
    (entry,) = cache_home.iterdir()
    entry.write_text(json.dumps({"value": {"role": "forged"}, "lines": [[["role"], 1]]}))
    return path, entry


def test_a_cache_entry_others_can_write_is_ignored(cache_home: Path, tmp_path: Path) -> None:
    path, entry = poisoned(cache_home, tmp_path)
    assert yamlfile.load_yaml_file(path)[0] == {"role": "forged"}  # our own entry: trusted
    entry.chmod(0o666)
    assert yamlfile.load_yaml_file(path)[0] == {"role": "honest"}
    entry.chmod(0o600)
    cache_home.chmod(0o777)
    assert yamlfile.load_yaml_file(path)[0] == {"role": "honest"}


def test_a_cache_entry_owned_by_someone_else_is_ignored(cache_home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path, _entry = poisoned(cache_home, tmp_path)
    # Seen from another user (no root needed to test it): the entry is not ours.
    monkeypatch.setattr(yamlfile.os, "geteuid", lambda: os.getuid() + 1000)
    assert yamlfile.load_yaml_file(path)[0] == {"role": "honest"}


def test_damaged_entries_and_no_cache(cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "a: 1\n")
    yamlfile.load_yaml_file(path)
    (entry,) = cache_home.iterdir()
    entry.write_text("{truncated")
    assert yamlfile.load_yaml_file(path)[0] == {"a": 1}
    monkeypatch.setenv("NODEWARDEN_NO_CACHE", "1")
    assert yamlfile.cache_dir() is None
    other = tmp_path / "other.yaml"
    other.write_text("b: 2\n")
    assert yamlfile.load_yaml_file(other)[0] == {"b": 2}
    assert len(list(cache_home.iterdir())) == 1  # nothing new written


def test_unwritable_cache_location_is_harmless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    assert yamlfile.load_yaml_file(write(tmp_path, "a: 1\n"))[0] == {"a": 1}
