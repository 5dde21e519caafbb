"""Files another local user controls must never choose what root writes (issue 21, items 3 and 12).

A site profile, the overrides, the waivers and the config decide what `remediate --apply` writes as
root; they are read only when root or the running user owns them and every folder up to a
root-owned one, and nobody else can write them (the state dir's rule). Security-relevant sysctls
(`kernel.core_pattern`, ...) are never remediated unless the operator's own profile opts in by
name. The YAML parse cache never follows another user's HOME. Everything runs the real CLI as
root on writable snapshot copies, with `nobody` as the other user.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from agent.io import yamlfile
from agent.io.yamlfile import LineMap
from agent.policy.profiles import ProfileFile, build, shipped_profile_dir
from tests.conftest import RunCli

NOBODY = 65534
CORE = "fs/proc/sys/kernel/core_pattern"
RMEM = "fs/proc/sys/net/core/rmem_max"
PWN = "|/tmp/pwn %p"


def need_root(why: str) -> None:
    assert os.geteuid() == 0, f"{why} needs root (CI runs as root)"


def site_profile(folder: Path, value: str = PWN, opt_in: bool = False) -> Path:
    """A profile that wins auto-selection for the drifted H100 (a site folder is searched first)."""
    folder.mkdir(exist_ok=True)
    path = folder / "hgx-h100-sxm.yaml"
    path.write_text(
        "name: hgx-h100-sxm\ndescription: site\nextends: hgx-common\n"
        + ("remediate_protected_sysctls: [kernel.core_pattern]\n" if opt_in else "")
        + 'match:\n  gpu_pci_ids: ["10de:2330"]\nexpect:\n  sysctl:\n    kernel.core_pattern:\n'
        + f"      equals: {json.dumps(value)}\n      severity: critical\n      reason: site policy\n")
    return path


def node_with_core_pattern(node: Path) -> Path:
    core = node / CORE
    core.unlink(missing_ok=True)  # a hard-linked copy: replace, never write through
    core.write_text("core\n")
    return node


def config_for(tmp_path: Path, **keys: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({key: value for key, value in keys.items()}) + "\n")
    return path


def remediate(run_cli: RunCli, node: Path, tmp_path: Path, config: Path) -> Any:
    return run_cli("remediate", "--snapshot", str(node), "--state-dir", str(tmp_path / "state"),
                   "--config", str(config), "--format", "json", "--apply")


def assert_nothing_applied(result: Any, node: Path, named: Path, *words: str) -> None:
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    assert str(named) in result.stderr and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    assert (node / CORE).read_text() == "core\n"
    assert (node / RMEM).read_text() == "4194304\n"  # the drifted value: nothing at all was applied


# ---- who may write the files that decide what root writes ----

def test_a_nobody_owned_world_writable_profile_is_refused_and_nothing_is_applied(
        run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    need_root("chown to nobody")
    node = node_with_core_pattern(drifted_copy)
    shared = tmp_path / "shared"
    profile = site_profile(shared)
    shared.chmod(0o777)
    profile.chmod(0o666)
    os.chown(shared, NOBODY, NOBODY)
    os.chown(profile, NOBODY, NOBODY)
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(shared)]))
    assert_nothing_applied(result, node, profile, "unsafe site profile", "owned by uid 65534")


def test_a_root_owned_profile_in_a_folder_others_can_write_is_refused(
        run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    node = node_with_core_pattern(drifted_copy)
    shared = tmp_path / "shared"
    profile = site_profile(shared, value="core")
    shared.chmod(0o1777)  # sticky or not: anybody could add a profile that wins auto-selection
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(shared)]))
    assert_nothing_applied(result, node, profile, str(shared), "writable by group and others")


def test_a_group_writable_profile_file_is_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    node = node_with_core_pattern(drifted_copy)
    profile = site_profile(tmp_path / "site", value="core")
    profile.chmod(0o664)
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(tmp_path / "site")]))
    assert_nothing_applied(result, node, profile, "writable by its group")


def test_a_profile_reached_through_a_symlink_nobody_owns_is_refused(
        run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    need_root("lchown to nobody")
    node = node_with_core_pattern(drifted_copy)
    site_profile(tmp_path / "real", value="core")
    link = tmp_path / "site"
    link.symlink_to(tmp_path / "real")
    os.lchown(link, NOBODY, NOBODY)  # nobody could point it at a folder of theirs next time
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(link)]))
    assert_nothing_applied(result, node, link / "hgx-h100-sxm.yaml", "symlink", "owned by uid 65534")


def test_a_link_to_a_link_nobody_owns_is_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    need_root("lchown to nobody")
    node = node_with_core_pattern(drifted_copy)
    site_profile(tmp_path / "real", value="core")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "theirs").symlink_to(tmp_path / "real")
    os.lchown(sticky / "theirs", NOBODY, NOBODY)
    (tmp_path / "site").symlink_to(sticky / "theirs")  # root's own link, pointing at nobody's
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(tmp_path / "site")]))
    assert_nothing_applied(result, node, tmp_path / "site" / "hgx-h100-sxm.yaml", str(sticky / "theirs"),
                           "owned by uid 65534")


@pytest.mark.parametrize("key", ["overrides_file", "waivers_file"])
def test_nobody_owned_overrides_and_waivers_are_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                         key: str) -> None:
    need_root("chown to nobody")
    node = node_with_core_pattern(drifted_copy)
    planted = tmp_path / f"{key}.yaml"
    planted.write_text("{}\n")
    os.chown(planted, NOBODY, NOBODY)
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, **{key: str(planted)}))
    assert_nothing_applied(result, node, planted, "owned by uid 65534")


def test_a_nobody_owned_config_is_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    need_root("chown to nobody")
    node = node_with_core_pattern(drifted_copy)
    config = config_for(tmp_path)
    os.chown(config, NOBODY, NOBODY)
    assert_nothing_applied(remediate(run_cli, node, tmp_path, config), node, config, "unsafe config file")


# ---- security-relevant sysctls ----

def _actions(result: Any) -> dict[str, Any]:
    return {action["id"]: action for action in json.loads(result.stdout)["actions"]}


def test_a_protected_sysctl_is_judged_but_never_written_without_the_opt_in(
        run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    node = node_with_core_pattern(drifted_copy)
    site_profile(tmp_path / "site")  # root's own file, safe folder: trusted, but no opt-in
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(tmp_path / "site")]))
    assert "Traceback" not in result.stderr
    action = _actions(result)["sysctl:kernel.core_pattern"]
    assert action["status"] == "refused" and not action["applied"]
    assert "security-relevant" in action["reason"] and "remediate_protected_sysctls" in action["reason"]
    assert (node / CORE).read_text() == "core\n"
    assert (node / RMEM).read_text() != "4194304\n"  # the ordinary drift (a plain sysctl) was still fixed
    audit = run_cli("audit", "--snapshot", str(node), "--config", str(tmp_path / "config.yaml"), "--format", "json")
    judged = [f for f in json.loads(audit.stdout)["findings"] if f["subject"] == "kernel.core_pattern"]
    assert [f["status"] for f in judged] == ["fail"]  # still judged


def test_the_operators_own_profile_may_opt_in_by_name(run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    node = node_with_core_pattern(drifted_copy)
    site_profile(tmp_path / "site", value="core.%p", opt_in=True)
    result = remediate(run_cli, node, tmp_path, config_for(tmp_path, profile_dirs=[str(tmp_path / "site")]))
    assert result.code == 0, result.stderr
    assert _actions(result)["sysctl:kernel.core_pattern"]["applied"] is True
    assert (node / CORE).read_text().split() == ["core.%p"]


def test_a_shipped_profile_cannot_opt_in() -> None:
    data = {"name": "x", "description": "x", "remediate_protected_sysctls": ["kernel.core_pattern"],
            "expect": {}}
    shipped = build([ProfileFile("x", shipped_profile_dir() / "x.yaml", data, LineMap())])
    site = build([ProfileFile("x", Path("/etc/nodewarden/profiles/x.yaml"), data, LineMap())])
    assert shipped.protected_sysctls == frozenset()
    assert site.protected_sysctls == {"kernel.core_pattern"}


# ---- the parse cache never follows another user's paths (item 12) ----

def test_root_never_follows_another_users_home_into_a_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_root("chown to nobody")
    base = Path(os.path.realpath("/tmp")) / f"nw-cache-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        home = base / "home"
        home.mkdir(mode=0o755)
        os.chown(home, NOBODY, NOBODY)
        victim = tmp_path / "victim"  # a root-owned folder nobody wants root to write into
        victim.mkdir(mode=0o700)
        (home / ".cache").symlink_to(victim)
        os.lchown(home / ".cache", NOBODY, NOBODY)
        monkeypatch.setenv("HOME", str(home))
        for name in ("XDG_CACHE_HOME", "CACHE_DIRECTORY", "NODEWARDEN_NO_CACHE"):
            monkeypatch.delenv(name, raising=False)
        doc = tmp_path / "doc.yaml"
        doc.write_text("a: 1\n")
        assert yamlfile.load_yaml_file(doc)[0] == {"a": 1}
        assert yamlfile.cache_dir() is None
        assert list(victim.iterdir()) == []  # root wrote nothing where nobody's link points
        monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))  # nobody's own folder, named directly
        assert yamlfile.load_yaml_file(doc)[0] == {"a": 1}
        assert not (home / "xdg").exists()
    finally:
        for path in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                path.rmdir()
        base.rmdir()


def test_roots_own_cache_folders_are_used_and_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.delenv("NODEWARDEN_NO_CACHE", raising=False)
    doc = tmp_path / "doc.yaml"
    doc.write_text("a: 1\n")
    yamlfile.load_yaml_file(doc)
    folder = tmp_path / "xdg" / "nodewarden" / "yaml"
    assert len(list(folder.iterdir())) == 1
    for level in (tmp_path / "xdg", folder.parent, folder):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700 and level.stat().st_uid == os.geteuid()


@pytest.mark.parametrize(("key", "entry"), [
    ("kernel.core_pattern", "kernel.core_pattern"), ("kernel.modprobe", "kernel.modprobe"),
    ("fs.protected_symlinks", "fs.protected_*"), ("kernel.yama.ptrace_scope", "kernel.yama.*"),
    ("fs.binfmt_misc.register", "fs.binfmt_misc.*"), ("user.max_user_namespaces", "user.*"),
    ("vm.zone_reclaim_mode", None), ("net.core.rmem_max", None), ("net.ipv4.conf.eth0/100.rp_filter", None),
])
def test_the_deny_list_is_matched_on_the_kernels_path(key: str, entry: str | None) -> None:
    from agent.sources.host import sysctl_path
    from remediations.sysctl import protected_sysctl

    assert protected_sysctl(sysctl_path(key)) == entry
