"""Password files: owner-only outside systemd; systemd credentials trusted as systemd made them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.core.errors import ConfigError
from agent.io.credentials import read_password_file


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


def owner_only(path: Path, text: str = "s3cret\n") -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_password_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = owner_only(tmp_path / "real")
    link = tmp_path / "bmc-password"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symlink"):
        read_password_file(link)
    assert read_password_file(target).reveal() == "s3cret"


def test_a_password_file_in_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    secret = owner_only(shared / "bmc-password")
    for mode in (0o777, 0o1777, 0o775):  # others could swap the file, sticky bit or not
        shared.chmod(mode)
        with pytest.raises(ConfigError, match="folder others can write to"):
            read_password_file(secret)
    shared.chmod(0o700)
    assert read_password_file(secret).reveal() == "s3cret"


def test_a_fifo_as_password_file_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "bmc-password"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="regular file"):
        read_password_file(fifo)


def test_a_password_never_reaches_a_log_line_in_any_form(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from agent.io.log import setup_logging

    password = 'q"u\\o\'te-Pw1'
    setup_logging(2, "json")
    from agent.io.credentials import Secret

    Secret(password)  # what read_password_file returns; making it registers the value for redaction
    logging.getLogger("redfish.rest.v1").warning('login body {"Password": "%s"} repr %r', password, password)
    logging.getLogger("nodewarden.test").error("X-Auth-Token: abc123token and Authorization: Basic dXNlcjpwdw==")
    err = capsys.readouterr().err
    assert password not in err and repr(password)[1:-1] not in err
    assert "abc123token" not in err and "dXNlcjpwdw==" not in err
    assert err.count("<REDACTED>") >= 3
