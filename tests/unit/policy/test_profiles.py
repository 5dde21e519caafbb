"""Profiles: shipped ones are valid; loading, inheritance, matching and every
kind of broken file give a clear error naming the file and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agent.core.errors import ProfileError
from agent.policy.matching import Identity, select
from agent.policy.profiles import FALLBACK_PROFILE, ProfileStore, shipped_profile_dir
from tests.conftest import RunCli

SHIPPED = sorted(p.stem for p in shipped_profile_dir().glob("*.yaml"))
CONCRETE = ["dgx-a100", "gb200-nvl-tray", "generic-nvidia", "hgx-b200", "hgx-h100-sxm", "hgx-h200-sxm"]


def write(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def identity(ids: list[str], dmi: dict[str, str] | None = None, driver: bool = True) -> Identity:
    return Identity(tuple(ids), len(ids), dmi or {"sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680"},
                    nvidia_driver=driver)


def test_the_issue_names_every_shipped_profile() -> None:
    assert set(CONCRETE) <= set(SHIPPED)
    assert {"base", "hgx-common"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_builds_and_every_expectation_has_reason_and_severity(name: str) -> None:
    profile = ProfileStore().profile(name)
    compiled = profile._compiled
    assert compiled, f"{name} has no expectations"
    for path, expectation in compiled.items():
        assert expectation.reason.strip(), path
        assert expectation.comparators, path


def test_cli_validates_all_shipped_files(run_cli: RunCli) -> None:
    result = run_cli("profiles", "validate", *(str(shipped_profile_dir() / f"{n}.yaml") for n in SHIPPED))
    assert result.code == 0, result.stderr
    assert result.stdout.count(": ok") == len(SHIPPED)


@pytest.mark.parametrize(("ids", "expected"), [
    (["10de:2330"] * 8, "hgx-h100-sxm"),
    (["10de:2330"] * 7, "hgx-h100-sxm"),  # a lost GPU must not change the profile
    (["10de:2335"] * 8, "hgx-h200-sxm"),
    (["10de:20b2"] * 8, "dgx-a100"),
    (["10de:20b0"] * 8, "dgx-a100"),
    (["10de:2901"] * 8, "hgx-b200"),
    (["10de:2941"] * 4, "gb200-nvl-tray"),
    (["10de:2342"], FALLBACK_PROFILE),  # GH200 is not an H200
    (["10de:2348"], FALLBACK_PROFILE),
    (["10de:2330"] * 4 + ["10de:2335"] * 4, FALLBACK_PROFILE),  # mixed boards match nothing
    ([], FALLBACK_PROFILE),
])
def test_matching_uses_exact_pci_ids(ids: list[str], expected: str) -> None:
    selection = select(identity(ids), ProfileStore())
    assert selection.profile.name == expected
    assert selection.how == ("fallback" if expected == FALLBACK_PROFILE else "auto")


def test_no_gpu_profile_needs_positive_evidence_of_a_host_without_gpus() -> None:
    # No GPU on PCI and no driver: not a GPU node. Unknown PCI, or a driver, keeps the GPU fallback.
    assert select(identity([], driver=False), ProfileStore()).how == "no_gpu"
    assert select(identity([], driver=True), ProfileStore()).profile.name == FALLBACK_PROFILE
    unread = Identity((), None, {}, ("PCI not read",), nvidia_driver=False)
    assert select(unread, ProfileStore()).profile.name == FALLBACK_PROFILE


def test_more_specific_site_profile_wins_and_equal_specificity_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "dell-xe9680-h100", """
        name: dell-xe9680-h100
        description: site profile
        extends: hgx-h100-sxm
        match:
          gpu_pci_ids: ["10de:2330"]
          dmi: {sys_vendor: ["Dell Inc."], product_name: ["PowerEdge XE9680"]}
    """)
    store = ProfileStore([tmp_path])
    selection = select(identity(["10de:2330"] * 8), store)
    assert selection.profile.name == "dell-xe9680-h100"
    assert "dmi.product_name=PowerEdge XE9680" in selection.matched_on
    # A different product name (exact match, not substring) falls back to the generic H100 profile.
    other = select(identity(["10de:2330"] * 8, {"sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680L"}),
                   store)
    assert other.profile.name == "hgx-h100-sxm"
    write(tmp_path, "twin", """
        name: twin
        description: overlaps hgx-h100-sxm exactly
        extends: hgx-h100-sxm
        match: {gpu_pci_ids: ["10de:2330"]}
    """)
    tie = select(identity(["10de:2330"] * 8, {"sys_vendor": "Other"}), ProfileStore([tmp_path]))
    assert tie.profile.name == "hgx-h100-sxm" and tie.also_matched == ("twin",)


def test_child_overrides_key_by_key_and_null_drops(tmp_path: Path) -> None:
    write(tmp_path, "parent", """
        name: parent
        description: p
        abstract: true
        expect:
          sysctl:
            vm.swappiness: {equals: 10, severity: warning, reason: keep}
            vm.max_map_count: {min: 1000, severity: warning, reason: drop me}
          thp:
            enabled: {one_of: [madvise, never], severity: warning, reason: parent reason}
    """)
    write(tmp_path, "child", """
        name: child
        description: c
        extends: parent
        expect:
          sysctl:
            vm.max_map_count: null
          thp:
            enabled: {equals: never, severity: critical, reason: child reason}
    """)
    profile = ProfileStore([tmp_path]).profile("child")
    assert set(profile.expectations_under("sysctl")) == {"vm.swappiness"}
    thp = profile.expectation("thp", "enabled")
    assert thp is not None
    # The child's expectation replaces the parent's whole: no inherited one_of.
    assert thp.comparators == (("equals", "never"),)
    assert thp.reason == "child reason"
    assert profile.origin("thp", "enabled").startswith(str(tmp_path / "child.yaml"))
    assert profile.origin("sysctl", "vm.swappiness").startswith(str(tmp_path / "parent.yaml"))


def test_overrides_file_applies_on_top(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("expect:\n  secure_boot: {equals: enabled, severity: critical, reason: site policy}\n")
    profile = ProfileStore(overrides_file=overrides).profile("hgx-h100-sxm")
    secure = profile.expectation("secure_boot")
    assert secure is not None and secure.comparators == (("equals", "enabled"),)
    assert profile.chain[-1] == str(overrides)


BROKEN = {
    "bad_yaml": ("name: x\ndescription: d\nexpect:\n  sysctl: [unclosed\n", 5,
                 "(while parsing a flow sequence started at line 4)"),
    "duplicate_key": ("name: x\ndescription: d\ndescription: e\n", 3, "duplicate key 'description'"),
    "unknown_key": ("name: x\ndescription: d\nexpect:\n  thp:\n    enabld: {equals: never, severity: warning, "
                    "reason: r}\n", 5, "unknown key 'enabld'"),
    "wrong_type": ("name: x\ndescription: d\nexpect:\n  sysctl:\n    vm.swappiness: {min: lots, severity: warning, "
                   "reason: r}\n", 5, "vm.swappiness"),
    "bad_severity": ("name: x\ndescription: d\nexpect:\n  secure_boot: {equals: enabled, severity: urgent, "
                     "reason: r}\n", 4, "'urgent' is not one of"),
    "missing_reason": ("name: x\ndescription: d\nexpect:\n  secure_boot: {equals: enabled, severity: info}\n", 4,
                       "missing required key 'reason'"),
    "no_comparator": ("name: x\ndescription: d\nexpect:\n  secure_boot: {severity: info, reason: r}\n", 4,
                      "needs one of"),
    "reversed_range": ("name: x\ndescription: d\nexpect:\n  sysctl:\n    vm.swappiness: {range: [60, 10], "
                       "severity: info, reason: r}\n", 5, "range low 60 > high 10"),
    "thp_as_sysctl": ("name: x\ndescription: d\nexpect:\n  sysctl:\n    vm.transparent_hugepage: {equals: never, "
                      "severity: info, reason: r}\n", 5, "sysfs"),
    "bad_pci_id": ("name: x\ndescription: d\nmatch:\n  gpu_pci_ids: ['H100']\n", 4, "does not match"),
    "name_mismatch": ("name: other\ndescription: d\n", 1, "must match the file name"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_profile_error_names_file_and_line(tmp_path: Path, case: str) -> None:
    body, line, text = BROKEN[case]
    path = tmp_path / "x.yaml"
    path.write_text(body)
    with pytest.raises(ProfileError) as info:
        ProfileStore([tmp_path]).validate_file(path)
    assert info.value.path == str(path)
    assert info.value.line == line, str(info.value)
    assert text in str(info.value)


def test_non_utf8_profile_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore([tmp_path]).validate_file(path)
    assert (info.value.path, info.value.line) == (str(path), 2)
    assert "UTF-8" in str(info.value)


def test_cyclic_extends_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a", "name: a\ndescription: d\nextends: b\n")
    write(tmp_path, "b", "name: b\ndescription: d\nextends: a\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore([tmp_path]).profile("a")
    assert "cyclic extends" in str(info.value)
    assert info.value.line == 3


def test_unknown_parent_names_the_child_file(tmp_path: Path) -> None:
    child = write(tmp_path, "child", "name: child\ndescription: d\nextends: nosuchparent\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore([tmp_path]).profile("child")
    assert info.value.path == str(child) and info.value.line == 3
    assert "unknown profile 'nosuchparent'" in str(info.value)


def test_broken_site_profile_makes_audit_exit_2_with_location(tmp_path: Path, run_cli: RunCli) -> None:
    site = tmp_path / "profiles"
    site.mkdir()
    write(site, "hgx-h100-sxm", "name: hgx-h100-sxm\ndescription: d\nextends: base\nexpect:\n  thp: {enabled: 3}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{site}]\n")
    result = run_cli("audit", "--simulate", "hgx-h100-healthy", "--config", str(config), "--format", "json")
    assert result.code == 2
    assert f"{site / 'hgx-h100-sxm.yaml'}:5:" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_unknown_or_abstract_profile_on_the_command_line(run_cli: RunCli) -> None:
    unknown = run_cli("audit", "--simulate", "hgx-h100-healthy", "--profile", "nope", "--format", "json")
    assert unknown.code == 2 and "unknown profile 'nope'" in unknown.stderr
    abstract = run_cli("audit", "--simulate", "hgx-h100-healthy", "--profile", "base", "--format", "json")
    assert abstract.code == 2 and "abstract" in abstract.stderr


def test_profiles_show_and_match(run_cli: RunCli) -> None:
    shown = run_cli("profiles", "show", "hgx-h200-sxm", "--format", "json")
    assert shown.code == 0
    doc = shown.json()
    assert doc["match"] == {"gpu_pci_ids": ["10de:2335"]}
    assert [Path(f).stem for f in doc["files"]] == ["base", "hgx-common", "hgx-h100-sxm", "hgx-h200-sxm"]
    matched = run_cli("profiles", "match", "--simulate", "hgx-h100-drifted")
    assert matched.code == 0
    assert "profile:  hgx-h100-sxm (auto)" in matched.stdout


def test_validate_reports_every_error_of_a_file_in_one_run(run_cli: RunCli, tmp_path: Path) -> None:
    """Issue 26.7: each schema violation of a file, and each expectation that cannot compile, in one run."""
    (tmp_path / "base.yaml").write_bytes((shipped_profile_dir() / "base.yaml").read_bytes())
    schema = tmp_path / "schema3.yaml"
    schema.write_text("name: schema3\nextends: base\ndescription: x\nexpect:\n  sysctl:\n"
                      "    vm.swappiness: {severity: nope, max: 10, reason: r}\n"
                      "  gpu:\n    persistence_mode: {severity: critical, equals: 'yes', reason: 5}\n"
                      "    persistence: {severity: warning, equals: true, reason: r}\n")
    built = tmp_path / "build2.yaml"
    built.write_text("name: build2\nextends: base\ndescription: x\nexpect:\n  sysctl:\n"
                     "    vm.transparent_hugepage: {severity: warning, equals: never, reason: r}\n"
                     "    net.core.rmem_max: {severity: warning, range: [10, 1], reason: r}\n"
                     "    vm.swappiness: {severity: warning, max: 10, reason: r}\n")
    result = run_cli("profiles", "validate", str(schema), str(built), str(tmp_path / "base.yaml"))
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{schema}:6", f"{schema}:8", f"{schema}:9", f"{built}:6",
                                                       f"{built}:7"], lines
    assert "'nope' is not one of" in lines[0] and "expected string, got 5" in lines[1] and "unknown key 'persistence'" in lines[2]
    assert "thp.enabled" in lines[3] and "range low 10 > high 1" in lines[4]
    assert result.stdout == f"{tmp_path / 'base.yaml'}: ok\n"


def test_validate_says_where_thp_lives_before_the_schemas_missing_keys(run_cli: RunCli, tmp_path: Path) -> None:
    """Issue 36.9: the schema alone says 'missing required key severity', which leads the user to complete a
    sysctl that does not exist; the domain hint comes first and the schema's complaint about that key goes."""
    path = tmp_path / "my-node.yaml"
    path.write_text("name: my-node\nextends: base\nexpect:\n  sysctl:\n    vm.transparent_hugepage: {equals: never}\n")
    result = run_cli("profiles", "validate", str(path))
    assert result.code == 2
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert "use thp.enabled" in lines[0], lines
    assert not any("severity" in line for line in lines), lines
    assert any("description" in line for line in lines)  # the file's other errors still follow
