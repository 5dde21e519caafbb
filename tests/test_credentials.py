"""Password files: owner-only outside systemd; systemd credentials trusted as systemd made them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.credentials import read_password_file
from agent.errors import ConfigError


def test_a_credential_systemd_passed_is_trusted_with_its_acl_style_mode(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Newer systemd leaves credentials owned by root, mode 0440 plus an ACL for the service user.
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    secret = credentials / "bmc-password"
    secret.write_text("from-systemd\n")
    secret.chmod(0o440)
    with pytest.raises(ConfigError, match="accessible by group or others"):
        read_password_file(secret)  # outside a credentials directory the owner-only rule holds
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert read_password_file(secret).reveal() == "from-systemd"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("x\n")
    elsewhere.chmod(0o440)
    with pytest.raises(ConfigError, match="accessible by group or others"):
        read_password_file(elsewhere)  # only files inside that directory are trusted
