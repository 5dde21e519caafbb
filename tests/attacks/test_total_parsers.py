"""Every parser of outside data is total: a bounded refusal naming the file (and line), never a
traceback, a hang or unbounded memory. YAML bombs, 100,000-deep JSON, oversized files, and
property tests that mutate the real captures in fixtures/ through each parser.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.errors import NodewardenError, ProfileError
from agent.io.jsonfile import JsonInputError, load_json_bytes, nesting_depth
from agent.io.yamlfile import parse_yaml
from agent.policy.profiles import ProfileStore
from agent.sources.importers.nvidia_smi import parse_nvidia_smi
from agent.sources.kmsg import parse_kmsg_text, read_recorded_kmsg
from agent.sources.xid import parse_xids
from remediations import RedfishPatch, UnsafeValue, guard_config_text, unsafe_for_config
from remediations.sysctl import set_conf_key
from tests.conftest import REPO
from tests.daemon_peer import running_daemon

FIXTURES = REPO / "fixtures"
LAUGHS = "".join(
    [f'{c}: &{c} [{", ".join([f"*{p}"] * 9)}]\n' for p, c in zip("abcdefgh", "bcdefghi", strict=True)])
BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + LAUGHS  # 9^9 strings
DEEP = 100_000
# The command in a child limited to 1 GiB of address space: a bomb must fail fast, not swap the host.
BOUNDED = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
           "sys.argv = ['nodewarden', *sys.argv[1:]]; runpy.run_module('agent', run_name='__main__')")
PROPERTY = settings(derandomize=True, database=None, max_examples=200, deadline=5000,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def nodewarden(*args: str, timeout: float = 60) -> tuple[int, str, float]:
    env = {**os.environ, "NODEWARDEN_NO_CACHE": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", BOUNDED, *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout, check=False)
    return proc.returncode, proc.stderr, time.monotonic() - start


def assert_clean_refusal(code: int, stderr: str, *names: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    for name in names:
        assert name in stderr, stderr


# ---- YAML: bombs, depth, size, values that do not convert ----

def test_billion_laughs_profile_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text("name: laughs\ndescription: nine to the ninth\n" + BOMB)
    code, stderr, took = nodewarden("profiles", "validate", str(path))
    assert_clean_refusal(code, stderr, f"{path}:4:", "aliases")
    assert took < 30


def test_billion_laughs_config_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("profile_dirs: []\n" + BOMB)
    code, stderr, took = nodewarden("audit", "--config", str(path), "--simulate", "hgx-h100-healthy")
    assert_clean_refusal(code, stderr, f"{path}:3:", "aliases")
    assert took < 30


@pytest.mark.parametrize(("text", "line", "words"), [
    pytest.param("a: " + "[" * 200 + "]" * 200 + "\n", 1, "nested deeper than 64", id="deep-flow"),
    pytest.param("x: 1\nn: " + "9" * 5000 + "\n", 2, "invalid YAML value", id="5000-digit-int"),
    pytest.param("x: 1\nn: !!int twelve\n", 2, "invalid YAML value", id="tagged-non-int"),
    pytest.param("a: &x 1\nb: *x\n", 2, "aliases (*x)", id="alias"),
])
def test_yaml_values_that_cannot_be_built_are_errors_with_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_yaml(text, "p.yaml", ProfileError)
    assert info.value.line == line and words in info.value.message


def test_oversized_yaml_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("name: big\ndescription: x\n" + "# padding\n" * 120_000)
    code, stderr, _ = nodewarden("profiles", "validate", str(path))
    assert_clean_refusal(code, stderr, str(path), "larger than 1 MiB")


def test_sighup_with_a_bomb_config_keeps_the_daemon_and_names_the_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(config),
                        env={"NODEWARDEN_NO_CACHE": "1"}) as daemon:
        config.write_text("profile_dirs: []\n" + BOMB)
        daemon.proc.send_signal(signal.SIGHUP)
        failed = daemon.wait_for(lambda: [e for e in daemon.log_events() if e.get("event") == "reload"
                                          and e.get("ok") is False], timeout=30, what="the refused reload")
        assert f"{config}:3:" in failed[0]["error"] and "aliases" in failed[0]["error"]
        assert daemon.scrape()[0] == 200 and daemon.proc.poll() is None


# ---- JSON: 100,000-deep and oversized inputs, by name ----

def deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


def replace(path: Path, data: bytes) -> None:
    path.unlink()  # hard-linked copy of the shared capture
    path.write_bytes(data)


@pytest.mark.parametrize("name", ["nvml.json", "fs_links.json"])
def test_deep_snapshot_json_is_a_clean_error(drifted_copy: Path, name: str) -> None:
    replace(drifted_copy / name, deep_json().encode())
    code, stderr, _ = nodewarden("audit", "--snapshot", str(drifted_copy), "--format", "json")
    assert_clean_refusal(code, stderr, name, "nested deeper than")


def test_deep_recorded_redfish_body_makes_the_bmc_facts_unknown(drifted_copy: Path) -> None:
    thermal = drifted_copy / "redfish/v1/Chassis/System.Embedded.1/Thermal/index.json"
    replace(thermal, ('{"Fans": ' + deep_json() + "}").encode())
    proc = subprocess.run([sys.executable, "-m", "agent", "audit", "--snapshot", str(drifted_copy), "--format",
                           "json"], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 1 and "internal error" not in proc.stderr, proc.stderr
    fans = next(f for f in json.loads(proc.stdout)["findings"] if f["check"] == "bmc.fans")
    assert fans["status"] == "unknown" and "nested deeper than" in fans["message"]


def test_oversized_nvml_recording_is_refused_by_name(drifted_copy: Path) -> None:
    data = (drifted_copy / "nvml.json").read_bytes()
    replace(drifted_copy / "nvml.json", data + b" " * (33 << 20))  # still valid JSON, just too big
    code, stderr, _ = nodewarden("audit", "--snapshot", str(drifted_copy), "--format", "json")
    assert_clean_refusal(code, stderr, "nvml.json", "larger than")


def test_deep_fleet_input_is_skipped_with_the_reason(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    good = {"schema": "nodewarden.report/v1", "node": {"hostname": "ok"}, "profile": "p",
            "started_at": "2026-11-29T11:00:00+00:00", "sources": {}, "findings": [], "summary": {}}
    (folder / "good.json").write_text(json.dumps(good))
    (folder / "deep.json").write_text('{"schema": "nodewarden.report/v1", "node": ' + deep_json() + "}")
    out = tmp_path / "fleet.json"
    proc = subprocess.run([sys.executable, "-m", "agent", "fleet", "report", str(folder), "--format", "json",
                           "--output", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    skipped = json.loads(out.read_text())["inputs"]["skipped"]
    assert [s["path"] for s in skipped] == [str(folder / "deep.json")]
    assert "nested deeper than 64 levels" in skipped[0]["reason"]


def test_the_loader_refuses_by_name_and_is_a_value_error() -> None:
    with pytest.raises(JsonInputError, match=r"^body\.json: 12 bytes or more: larger than the 10") as info:
        load_json_bytes(b"[1, 2, 3, 4]", what="body.json", max_bytes=10)
    assert isinstance(info.value, ValueError) and info.value.exit_code == 2
    with pytest.raises(JsonInputError, match=r"^x:2: not JSON"):
        load_json_bytes('{"a":\n ]', what="x")
    with pytest.raises(JsonInputError, match="nested deeper than 3"):
        load_json_bytes('{"a": [[{"b": 1}]]}', what="x", max_depth=3)
    assert load_json_bytes('{"a": ["[[[[", "\\\\", "\\"[{"]}', what="x", max_depth=2) == {"a": ["[[[[", "\\", '"[{']}


# ---- values that go into config files: refused at load and again at write time ----

def test_profile_with_a_newline_in_a_sysctl_value_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nl.yaml"
    path.write_text('name: nl\ndescription: x\nextends: base\nexpect:\n  sysctl:\n    vm.swappiness:\n'
                    '      equals: "10\\nkernel.core_pattern = |/tmp/evil"\n      severity: warning\n'
                    "      reason: x\n")
    code, stderr, _ = nodewarden("profiles", "validate", str(path))
    assert_clean_refusal(code, stderr, f"{path}:7:")


@pytest.mark.parametrize("field", ["min: \"5\\n\"", "one_of: [a, \"b\\x1b[2J\"]", "max: \"9\\u2028x\""])
def test_other_written_comparators_with_control_characters_are_refused(tmp_path: Path, field: str) -> None:
    path = tmp_path / "cc.yaml"
    path.write_text(f"name: cc\ndescription: x\nextends: base\nexpect:\n  sysctl:\n    vm.swappiness:\n"
                    f"      {field}\n      severity: warning\n      reason: x\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore([tmp_path]).validate_file(path)
    assert info.value.path == str(path) and info.value.line == 7


def test_a_sysctl_key_with_a_trailing_newline_fails_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "key.yaml"
    path.write_text('name: key\ndescription: x\nexpect:\n  sysctl:\n    "vm.swappiness\\n":\n'
                    "      equals: 10\n      severity: warning\n      reason: x\n")
    with pytest.raises(ProfileError, match="does not match"):
        ProfileStore([tmp_path]).validate_file(path)


def test_the_write_time_guard_refuses_line_breaks_in_keys_and_values() -> None:
    assert unsafe_for_config("vm.swappiness", "10") is None
    for key, value in (("vm.swappiness", "10\nkernel.core_pattern = |/tmp/x"), ("mtu.eth0\n", "9000"),
                       ("vm.swappiness", "1\x00"), ("thp.enabled", "never\u2028x")):
        with pytest.raises(UnsafeValue):
            set_conf_key(b"# ours\n", key, value)
        with pytest.raises(ValueError, match="control character or line break"):
            guard_config_text(key, value)
    with pytest.raises(UnsafeValue):
        RedfishPatch("/redfish/v1/Systems/1/Bios", "/redfish/v1/Systems/1/Bios/Settings",
                     (("SysProfile", "PerfOptimized\r\nInjected"),))
    RedfishPatch("/redfish/v1/Systems/1/Bios", "/redfish/v1/Systems/1/Bios/Settings", (("ProcCStates", 0),))


# ---- property tests: real captures, mutated, through each parser ----

TOKENS = [b"\x00", b"\xff", b"\n", b"\r\n", b"\t", b"    ", b" : ", b":", b"[", b"]", b"{", b"}", b'"', b"\\",
          b"\\u", b"\\udcff", b"<", b"</", b"<!ENTITY x 'y'>", b"&", b"&a ", b"*a", b"- ", b"!!", b"? ", b"N/A",
          b"9" * 40, b"-1", b"\xe2\x80\xae", b"\xed\xb3\xbf", b"GPU 00000000:00:00.0", b"Attached GPUs : 99",
          b"NVRM: Xid (PCI:0000:19:00): 79, ", b"<6>[    1.000000] ", b"1e999", b"NaN", b"[[[[[[[[[[[[", b"]]]]",
          b"9" * 4400, b" !!int x", b" !!binary x", b"\nz: &a [1, 2]\nw: [*a, *a]\n"]
MUTATIONS = st.lists(st.tuples(st.sampled_from(["insert", "delete", "replace", "truncate", "repeat", "value"]),
                               st.floats(0, 1), st.integers(0, 64),
                               st.one_of(st.sampled_from(TOKENS), st.binary(max_size=8))),
                     min_size=1, max_size=6)
YAML_VALUES = [b"9" * 4400, b"!!int x", b"!!float y", b"!!timestamp z", b"!!binary x", b"*a", b"&a [1, *a]",
               b'"\\udcff"', b'"a\\nb"', b"[" * 70 + b"]" * 70, b"{a: [b, {c: d}]}", b"!!python/name:os.system x"]
PROFILE_MUTATIONS = st.lists(st.one_of(
    st.tuples(st.just("value"), st.floats(0, 1), st.just(0), st.sampled_from(YAML_VALUES)),
    MUTATIONS.map(lambda ops: ops[0])), min_size=1, max_size=4)


def mutate(data: bytes, ops: list[tuple[str, float, int, bytes]]) -> bytes:
    for kind, where, size, token in ops:
        at = int(where * len(data))
        if kind == "insert":
            data = data[:at] + token + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + size:]
        elif kind == "replace":
            data = data[:at] + token + data[at + len(token):]
        elif kind == "truncate":
            data = data[:at]
        elif kind == "value":  # the value of one `key: value` line (YAML) or `"key": value` (JSON)
            lines = data.split(b"\n")
            line = lines[min(int(where * len(lines)), len(lines) - 1)]
            key, sep, _ = line.partition(b": ")
            lines[min(int(where * len(lines)), len(lines) - 1)] = key + (sep or b": ") + token
            data = b"\n".join(lines)
        else:
            data = data[:at] + data[at:at + size] * 200 + data[at:]
    return data


def files(folder: Path, *patterns: str, every: int = 1) -> list[Path]:
    found = sorted(p for pattern in patterns for p in folder.rglob(pattern) if p.is_file())
    return found[::every]


NVSMI = files(FIXTURES / "nvidia-smi", "*.txt", "*.xml")
KMSG = files(FIXTURES / "kmsg", "*")
REDFISH = files(FIXTURES / "redfish", "index.json", every=25)
PROFILES = files(REPO / "profiles", "*.yaml")


def test_the_property_tests_have_real_captures() -> None:
    assert len(NVSMI) >= 20 and len(KMSG) >= 3 and len(REDFISH) >= 20 and len(PROFILES) >= 5


@PROPERTY
@given(st.sampled_from(NVSMI), MUTATIONS)
def test_nvidia_smi_importer_on_mutated_dumps(path: Path, ops: list[Any]) -> None:
    text = mutate(path.read_bytes(), ops).decode("utf-8", errors="replace")  # as the importer decodes
    try:
        document = parse_nvidia_smi(text, path.name)
    except NodewardenError:
        return
    json.dumps(document)  # what it returns can be written as nvml.json


@PROPERTY
@given(st.sampled_from(KMSG), MUTATIONS)
def test_kmsg_parser_on_mutated_logs(path: Path, ops: list[Any]) -> None:
    data = mutate(path.read_bytes(), ops)
    records = parse_kmsg_text(data.decode("utf-8", errors="replace").splitlines())
    parse_xids(records)
    with tempfile.TemporaryDirectory() as folder:
        recorded = Path(folder) / "kmsg.txt"
        recorded.write_bytes(data)
        result = read_recorded_kmsg(recorded)
    if isinstance(result, tuple):
        parse_xids(result)


def depth(value: Any) -> int:
    """How many containers deep `value` nests (iteratively: the value may be deep)."""
    level, deepest = [value], 0
    while containers := [item for item in level if isinstance(item, (dict, list))]:
        deepest += 1
        level = [v for item in containers for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


@PROPERTY
@given(st.sampled_from(REDFISH), MUTATIONS)
def test_bounded_loader_on_mutated_redfish_bodies(path: Path, ops: list[Any]) -> None:
    try:
        value = load_json_bytes(mutate(path.read_bytes(), ops), what=str(path))
    except JsonInputError as exc:
        assert exc.path == str(path)
        return
    assert depth(value) <= 64
    json.dumps(value)


@PROPERTY
@given(st.sampled_from(PROFILES), PROFILE_MUTATIONS)
def test_profile_loader_on_mutated_profiles(path: Path, ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, {"NODEWARDEN_NO_CACHE": "1"}):
        target = Path(folder) / path.name
        target.write_bytes(mutate(path.read_bytes(), ops))
        try:
            ProfileStore([Path(folder)]).validate_file(target)
        except NodewardenError as exc:
            assert exc.path is not None


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ax:,', max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                               st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3),
                           max_leaves=40)


@PROPERTY
@given(JSON_VALUES, st.booleans())
def test_the_bracket_scan_measures_the_true_depth(value: Any, indent: bool) -> None:
    text = json.dumps(value, indent=1 if indent else None, ensure_ascii=indent)
    assert nesting_depth(text.encode(), 100) == depth(value)
    assert nesting_depth(text.encode(), 2) == min(depth(value), 3)
