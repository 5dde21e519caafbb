"""YAML loading with lines, the small JSON-schema validator, and its agreement with `jsonschema`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agent.core.errors import NodewardenError, ProfileError
from agent.io.schema import SchemaError, Validator, check_schema_keywords, describe_path, validate_document
from agent.io.yamlfile import LineMap, load_yaml_file, parse_yaml
from agent.policy.profiles import shipped_profile_dir

# ---------------------------------------------------------------------------------------------
# yamlfile
# ---------------------------------------------------------------------------------------------


def yaml_error(text: str) -> NodewardenError:
    with pytest.raises(NodewardenError) as info:
        parse_yaml(text, "p.yaml")
    return info.value


def test_duplicate_key_is_rejected_with_its_line() -> None:
    """PyYAML keeps the last duplicate silently; we name the file and line instead."""
    err = yaml_error("name: a\nexpect:\n  sysctl:\n    vm.swappiness: 1\n    vm.swappiness: 2\n")
    assert (err.message, err.path, err.line) == ("duplicate key 'vm.swappiness'", "p.yaml", 5)
    assert str(err) == "p.yaml:5: duplicate key 'vm.swappiness'"


def test_merge_keys_are_rejected() -> None:
    err = yaml_error("base: &b {severity: info}\nother:\n  <<: *b\n  reason: x\n")
    assert err.line == 3
    assert "merge keys" in err.message


def test_complex_keys_are_rejected() -> None:
    err = yaml_error("? [a, b]\n: 1\n")
    assert err.line == 1 and "complex keys" in err.message


@pytest.mark.parametrize(("text", "line"), [
    ("a: 1\n b: 2\n", 2),
    ("a: [1, 2\nb: 3\n", 2),
    ("a:\n  - x\n  - {y: 1\n", 4),
    ("a: 'open\n\nb: 2\n", 4),
])
def test_malformed_yaml_error_has_the_line(text: str, line: int) -> None:
    err = yaml_error(text)
    assert err.message.startswith("invalid YAML: ")
    assert err.line == line


def test_unsafe_tag_is_an_error_with_line() -> None:
    err = yaml_error("ok: 1\na: !!python/name:os.system ''\n")
    assert err.line == 2 and err.message.startswith("invalid YAML value")


def test_error_class_is_the_callers(tmp_path: Path) -> None:
    with pytest.raises(ProfileError):
        parse_yaml("a: 1\na: 2\n", "p.yaml", ProfileError)
    with pytest.raises(ProfileError, match="cannot read"):
        load_yaml_file(tmp_path / "absent.yaml", ProfileError)


def test_non_utf8_file_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(NodewardenError) as info:
        load_yaml_file(path)
    assert (info.value.path, info.value.line) == (str(path), 2)
    assert info.value.message == "not valid UTF-8 (byte 24)"


def test_dates_are_kept_as_iso_strings() -> None:
    data, _ = parse_yaml("expires: 2025-01-31\nat: 2025-01-31T10:00:00Z\nn: 1\nf: 1.5\nb: true\nz: null\n", "w")
    assert data == {"expires": "2025-01-31", "at": "2025-01-31T10:00:00Z", "n": 1, "f": 1.5, "b": True, "z": None}
    assert json.dumps(data)  # JSON-serialisable: no datetime objects


def test_empty_document() -> None:
    assert parse_yaml("", "e") == (None, LineMap())
    assert parse_yaml("# only a comment\n", "e") == (None, LineMap())


def test_line_map_records_keys_and_items_and_falls_back_to_ancestors() -> None:
    text = "# header\nname: x\nexpect:\n  sysctl:\n    vm.swappiness:\n      max: 10\nlist:\n  - a\n  - b: 1\n"
    _, lines = parse_yaml(text, "p")
    assert lines[("name",)] == 2
    assert lines[("expect", "sysctl", "vm.swappiness", "max")] == 6
    assert lines[("list", 1, "b")] == 9
    assert lines.line_for(("expect", "sysctl", "vm.swappiness", "severity")) == 5  # missing: its parent
    assert lines.line_for(("expect", "sysctl", "kernel.x", "y", "z")) == 4
    assert lines.line_for(("nothing", "here")) == 2  # the document root
    assert LineMap().line_for(("a",)) is None


# ---------------------------------------------------------------------------------------------
# the validator, keyword by keyword
# ---------------------------------------------------------------------------------------------


def errors(schema: dict[str, Any], value: Any) -> list[SchemaError]:
    return Validator(schema).errors(value)


def messages(schema: dict[str, Any], value: Any) -> list[tuple[str, str]]:
    return [(describe_path(e.path), e.message) for e in errors(schema, value)]


def test_type_errors() -> None:
    assert messages({"type": "integer"}, "7") == [("(top level)", "expected integer, got '7'")]
    assert messages({"type": ["string", "null"]}, 3) == [("(top level)", "expected string or null, got 3")]
    assert errors({"type": "number"}, 1.5) == []
    assert errors({"type": "number"}, 2) == []
    assert errors({"type": ["object", "null"]}, None) == []


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_integer_or_number(value: bool) -> None:
    assert messages({"type": "integer"}, value) == [("(top level)", f"expected integer, got {value}")]
    assert errors({"type": "number"}, value) != []
    assert errors({"type": "boolean"}, value) == []
    assert errors({"type": "boolean"}, 1) != []


def test_enum_and_const() -> None:
    schema = {"enum": ["info", "warning", "critical"]}
    assert messages(schema, "fatal") == [("(top level)", "'fatal' is not one of: info, warning, critical")]
    assert errors(schema, "info") == []
    assert messages({"const": "v1"}, "v2") == [("(top level)", "must be 'v1'")]


def test_additional_properties_false_names_the_unknown_key() -> None:
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"severity": {}, "reason": {}}}
    assert messages(schema, {"severity": "info", "reasn": "x"}) == [
        ("reasn", "unknown key 'reasn' (allowed: reason, severity)")]
    assert messages({"type": "object", "additionalProperties": False}, {"a": 1}) == [
        ("a", "unknown key 'a' (allowed: none)")]


def test_additional_properties_schema_and_pattern_properties() -> None:
    schema = {"type": "object", "patternProperties": {"^x-": {"type": "string"}},
              "additionalProperties": {"type": "integer"}}
    assert errors(schema, {"x-a": "s", "b": 1}) == []
    assert messages(schema, {"x-a": 1, "b": "s"}) == [
        ("x-a", "expected string, got 1"), ("b", "expected integer, got 's'")]


def test_required_and_min_properties() -> None:
    schema = {"type": "object", "required": ["name", "description"], "minProperties": 1}
    assert messages(schema, {"name": "x"}) == [("(top level)", "missing required key 'description'")]
    assert messages({"type": "object", "minProperties": 1}, {}) == [("(top level)", "needs at least 1 key(s)")]


def test_pattern_is_a_search_like_json_schema() -> None:
    assert errors({"pattern": "b"}, "abc") == []  # unanchored, as ECMA 262 `test`
    assert messages({"pattern": "^[a-z]+$"}, "Abc") == [("(top level)", "'Abc' does not match ^[a-z]+$")]
    assert errors({"pattern": "^[a-z]+$"}, 5) == []  # applies to strings only


def test_property_names() -> None:
    schema = {"type": "object", "propertyNames": {"pattern": "^[a-z0-9_]+$"}}
    assert messages(schema, {"nvidia_peermem": 1, "nvidia-peermem": 2}) == [
        ("nvidia-peermem", "key 'nvidia-peermem': 'nvidia-peermem' does not match ^[a-z0-9_]+$")]


def test_string_lengths() -> None:
    assert messages({"minLength": 1}, "") == [("(top level)", "must not be empty")]
    assert messages({"minLength": 3}, "ab") == [("(top level)", "needs at least 3 characters")]
    assert messages({"maxLength": 2}, "abc") == [("(top level)", "allows at most 2 characters")]
    assert errors({"maxLength": 2}, "é€") == []  # code points, not bytes


def test_any_of_and_one_of() -> None:
    number_or_list = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]}
    assert errors(number_or_list, 3) == []
    assert errors(number_or_list, [1, 2]) == []
    # Every alternative fails at the top: one message listing them all.
    assert messages(number_or_list, "x") == [
        ("(top level)", "does not match any allowed form (expected integer, got 'x'; expected array, got 'x')")]
    # The alternative that got furthest (into the list) is the one reported.
    assert messages(number_or_list, [1, "two"]) == [("[1]", "expected integer, got 'two'")]

    one_of = {"oneOf": [{"type": "integer"}, {"minimum": 0}]}
    assert errors(one_of, -1) == []
    assert messages(one_of, 5) == [("(top level)", "matches more than one allowed form")]
    assert errors(one_of, "s") == []  # `minimum` ignores strings, so exactly one form matches


def test_not_and_boolean_schemas() -> None:
    assert messages({"not": {"type": "null"}}, None) == [("(top level)", "matches a form that is not allowed")]
    assert errors({"not": {"type": "null"}}, 1) == []
    schema = {"type": "object", "properties": {"gone": False, "any": True}}
    assert messages(schema, {"gone": 1, "any": [1]}) == [("gone", "is not allowed here")]


def test_ref_to_defs() -> None:
    schema = {"$defs": {"severity": {"enum": ["info", "warning"]}},
              "type": "object", "properties": {"severity": {"$ref": "#/$defs/severity"}}}
    assert errors(schema, {"severity": "info"}) == []
    assert messages(schema, {"severity": "loud"}) == [("severity", "'loud' is not one of: info, warning")]


def test_ref_must_be_local() -> None:
    validator = Validator({"$ref": "https://example.com/other.json"})
    with pytest.raises(ValueError, match="only local"):
        validator.errors(1)


def test_array_keywords() -> None:
    schema = {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"}}
    assert errors(schema, [1, 2.5]) == []
    assert messages(schema, [1]) == [("(top level)", "needs at least 2 item(s)")]
    assert messages(schema, [1, 2, 3]) == [("(top level)", "allows at most 2 item(s)")]
    assert messages(schema, [1, "2"]) == [("[1]", "expected number, got '2'")]
    assert messages({"uniqueItems": True}, ["a", "b", "a"]) == [("(top level)", "duplicate item 'a'")]
    assert errors({"uniqueItems": False}, ["a", "a"]) == []


def test_number_bounds() -> None:
    assert messages({"minimum": 0}, -1) == [("(top level)", "must be >= 0")]
    assert errors({"minimum": 0}, 0) == []
    assert messages({"maximum": 10}, 10.5) == [("(top level)", "must be <= 10")]
    assert messages({"exclusiveMinimum": 0}, 0) == [("(top level)", "must be > 0")]
    assert errors({"exclusiveMinimum": 0}, 0.001) == []
    assert errors({"minimum": 0}, True) == []  # bounds ignore booleans, as JSON Schema does


def test_describe_path() -> None:
    assert describe_path(()) == "(top level)"
    assert describe_path(("expect", "sysctl", "vm.swappiness", "min")) == "expect.sysctl['vm.swappiness'].min"
    assert describe_path(("match", "gpu_pci_ids", 0)) == "match.gpu_pci_ids[0]"
    assert describe_path(("network", "mtu", "rdma-ib")) == "network.mtu.rdma-ib"


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "string", "format": "email"}, "#"),
    ({"if": {"type": "string"}, "then": {}}, "#"),
    ({"properties": {"a": {"type": "string", "format": "date"}}}, "#/properties/a"),
    ({"$defs": {"x": {"dependentRequired": {}}}}, "#/$defs/x"),
    ({"items": {"prefixItems": []}}, "#/items"),
    ({"anyOf": [{"type": "null"}, {"contains": {}}]}, "#/anyOf/1"),
    ({"additionalProperties": {"unevaluatedProperties": False}}, "#/additionalProperties"),
    ({"patternProperties": {"^x": {"multipleOf": 2}}}, "#/patternProperties/^x"),
])
def test_unsupported_keywords_are_refused(schema: dict[str, Any], where: str) -> None:
    """A keyword this validator lacks would be silently ignored; refuse the schema instead."""
    with pytest.raises(ValueError, match="unsupported keywords") as info:
        check_schema_keywords(schema)
    assert f"schema at {where} uses" in str(info.value)
    with pytest.raises(ValueError, match="unsupported keywords"):
        Validator(schema)


def test_validate_document_reports_the_first_error_in_the_file() -> None:
    text = ("name: t\ndescription: d\nexpect:\n  thp:\n    enabled:\n      equals: madvise\n"
            "      severity: loud\n      reason: r\nbogus: 1\n")
    data, lines = parse_yaml(text, "t.yaml")
    with pytest.raises(ProfileError) as info:
        validate_document(data, lines, "t.yaml", Validator(shipped_schema()), ProfileError)
    assert info.value.line == 7
    assert str(info.value).startswith("t.yaml:7: expect.thp.enabled.severity: 'loud' is not one of")


# ---------------------------------------------------------------------------------------------
# agreement with jsonschema
# ---------------------------------------------------------------------------------------------


def shipped_schema() -> dict[str, Any]:
    return json.loads((shipped_profile_dir() / "schema.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def agree(schema: dict[str, Any], doc: Any) -> tuple[bool, bool]:
    """(jsonschema says valid, agent.io.schema says valid)."""
    return jsonschema.Draft202012Validator(schema).is_valid(doc), not Validator(schema).errors(doc)


@pytest.mark.parametrize(("schema", "value"), [
    pytest.param({"type": "integer"}, 3, id="integer-3"),
    pytest.param({"type": "integer"}, 3.5, id="integer-3.5"),
    pytest.param({"type": "integer"}, True, id="integer-true"),
    # JSON Schema: a number with a zero fractional part is an integer.
    pytest.param({"type": "integer"}, 8.0, id="integer-8.0"),
    pytest.param({"type": "number"}, False, id="number-false"),
    # JSON Schema: true is not 1 and false is not 0, in enum, const and uniqueItems alike.
    pytest.param({"enum": [1, 2]}, True, id="enum-1-true"),
    pytest.param({"enum": [0]}, False, id="enum-0-false"),
    pytest.param({"const": 1}, True, id="const-1-true"),
    pytest.param({"uniqueItems": True}, [1, True], id="unique-1-true"),
    pytest.param({"uniqueItems": True}, [1, 1.0], id="unique-1-1.0"),
    pytest.param({"enum": ["a"]}, "a", id="enum-a"),
    pytest.param({"minimum": 1}, False, id="minimum-false"),
    pytest.param({"pattern": "^a"}, "ba", id="pattern-anchored"),
    pytest.param({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 2, id="oneof-two-match"),
    pytest.param({"anyOf": [{"type": "string"}, {"type": "null"}]}, None, id="anyof-null"),
    pytest.param({"properties": {"a": {"type": "integer"}}, "additionalProperties": False}, {"a": 1, "b": 2},
                 id="additional-false"),
    pytest.param({"propertyNames": {"maxLength": 2}}, {"abc": 1}, id="property-names"),
])
def test_keyword_semantics_agree_with_jsonschema(schema: dict[str, Any], value: Any) -> None:
    """Keyword by keyword, including JSON's bool/int/float equality rules."""
    reference, ours = agree(schema, value)
    assert ours == reference


def test_shipped_schema_is_a_valid_2020_12_schema_using_only_supported_keywords() -> None:
    schema = shipped_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    check_schema_keywords(schema)


def shipped_profiles() -> list[Path]:
    return sorted(shipped_profile_dir().glob("*.yaml"))


def test_shipped_profiles_are_found() -> None:
    names = {p.stem for p in shipped_profiles()}
    assert {"base", "generic-nvidia", "hgx-h100-sxm"} <= names
    assert len(names) >= 5


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_agreement_on_shipped_profiles(path: Path) -> None:
    doc, _ = load_yaml_file(path)
    reference, ours = agree(shipped_schema(), doc)
    assert ours == reference
    assert reference, f"{path.name} is not valid against its own schema"


def _exp(**comparators: Any) -> dict[str, Any]:
    return {**comparators, "severity": "warning", "reason": "a reason"}


VALID_PROFILE: dict[str, Any] = {
    "name": "test-node",
    "description": "A test node",
    "extends": "hgx-common",
    "abstract": False,
    "match": {"gpu_pci_ids": ["10de:2330"], "gpu_count": 8, "dmi": {"sys_vendor": ["Supermicro"]}},
    "expect": {
        "sysctl": {
            "vm.swappiness": _exp(max=10),
            "net.ipv4.tcp_rmem": _exp(min=[4096, 87380, 134217728]),
            "net.ipv4.tcp_wmem": _exp(min="4096 65536 134217728"),
            "net.ipv4.conf.eth0/100.rp_filter": _exp(one_of=[0, 2]),
            "kernel.numa_balancing": None,
        },
        "thp": {"enabled": _exp(equals="madvise"), "defrag": None},
        "numa": {"balancing": _exp(equals=0), "affinity": _exp(equals="local")},
        "network": {"mtu": {
            "rdma": {"match": {"rdma": True, "link_layer": ["InfiniBand"]}, "expect": _exp(min=4092)},
            "ethernet": {"match": {"names": ["ens*"], "bond_members": False, "driver": ["mlx5_core"],
                                   "pci_ids": ["15b3:1021"]}, "expect": _exp(equals=9000)},
            "old-rule": None,
        }},
        "cpu": {"governor": _exp(one_of=["performance"]), "cstates": _exp(max=10)},
        "kernel_cmdline": {"iommu": _exp(equals="pt"), "intel_idle.max_cstate": _exp(range=[0, 1])},
        "secure_boot": _exp(equals="enabled"),
        "driver": {"version": _exp(version_min="550.54.15", one_of=["550.90.07", "560.35.03"])},
        "modules": {"nvidia_peermem": _exp(equals="loaded")},
        "gpu_pci": {"count": _exp(equals=8)},
    },
}

DELETE = object()


def mutate(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of VALID_PROFILE with one key set (or deleted)."""
    doc = copy.deepcopy(VALID_PROFILE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


SYSCTL = ("expect", "sysctl")
THP_ENABLED = ("expect", "thp", "enabled")
RDMA_RULE = ("expect", "network", "mtu", "rdma")

BROKEN_PROFILES: dict[str, dict[str, Any]] = {
    "name-not-a-string": mutate(("name",), 123),
    "name-bad-pattern": mutate(("name",), "HGX_H100"),
    "description-missing": mutate(("description",), DELETE),
    "description-empty": mutate(("description",), ""),
    "unknown-top-level-key": mutate(("expects",), {}),
    "abstract-not-boolean": mutate(("abstract",), "yes"),
    "extends-null": mutate(("extends",), None),
    "sysctl-key-upper-case": mutate((*SYSCTL, "VM.swappiness"), _exp(max=10)),
    "sysctl-key-without-dot": mutate((*SYSCTL, "swappiness"), _exp(max=10)),
    "sysctl-key-with-space": mutate((*SYSCTL, "vm.swap piness"), _exp(max=10)),
    "sysctl-not-an-expectation": mutate((*SYSCTL, "vm.swappiness"), 10),
    "severity-unknown": mutate((*THP_ENABLED, "severity"), "fatal"),
    "severity-null": mutate((*THP_ENABLED, "severity"), None),
    "reason-empty": mutate((*THP_ENABLED, "reason"), ""),
    "reason-missing": mutate((*THP_ENABLED, "reason"), DELETE),
    "unknown-comparator": mutate(("expect", "cpu", "governor", "at_least"), "performance"),
    "range-three-items": mutate(("expect", "kernel_cmdline", "intel_idle.max_cstate", "range"), [0, 1, 2]),
    "range-boolean-item": mutate(("expect", "kernel_cmdline", "intel_idle.max_cstate", "range"), [True, 1]),
    "min-not-a-number": mutate((*SYSCTL, "vm.swappiness", "max"), "ten"),
    "min-empty-list": mutate((*SYSCTL, "net.ipv4.tcp_rmem", "min"), []),
    "min-boolean": mutate((*SYSCTL, "net.ipv4.tcp_rmem", "min"), True),
    "one-of-empty": mutate(("expect", "cpu", "governor", "one_of"), []),
    "equals-a-list": mutate(("expect", "secure_boot", "equals"), ["enabled"]),
    "version-min-boolean": mutate(("expect", "driver", "version", "version_min"), True),
    "pci-id-upper-case": mutate(("match", "gpu_pci_ids"), ["10DE:2330"]),
    "pci-id-without-colon": mutate(("match", "gpu_pci_ids"), ["10de2330"]),
    "pci-id-duplicate": mutate(("match", "gpu_pci_ids"), ["10de:2330", "10de:2330"]),
    "gpu-count-negative": mutate(("match", "gpu_count"), -1),
    "gpu-count-string": mutate(("match", "gpu_count"), "8"),
    "match-empty": mutate(("match",), {}),
    "dmi-empty-value": mutate(("match", "dmi", "product_name"), [""]),
    "dmi-unknown-field": mutate(("match", "dmi", "serial"), ["X"]),
    "mtu-rule-extra-key": mutate((*RDMA_RULE, "mtu"), 4092),
    "mtu-rule-missing-match": mutate((*RDMA_RULE, "match"), DELETE),
    "mtu-rule-match-empty": mutate((*RDMA_RULE, "match"), {}),
    "mtu-rule-bad-link-layer": mutate((*RDMA_RULE, "match", "link_layer"), ["RoCE"]),
    "mtu-rule-pci-id-upper-case": mutate((*RDMA_RULE, "match", "pci_ids"), ["15B3:1021"]),
    "mtu-rule-name-upper-case": mutate(("expect", "network", "mtu", "RDMA"), VALID_PROFILE["expect"]["network"]["mtu"]["rdma"]),
    "mtu-rule-expect-unknown-key": mutate((*RDMA_RULE, "expect", "mtu"), 9000),
    "module-name-with-dash": mutate(("expect", "modules", "nvidia-peermem"), _exp(equals="loaded")),
    "cmdline-key-leading-dash": mutate(("expect", "kernel_cmdline", "-iommu"), _exp(equals="pt")),
    "unknown-expect-section": mutate(("expect", "bmcx"), {}),
    "unknown-numa-key": mutate(("expect", "numa", "interleave"), _exp(equals=1)),
    "expect-a-list": mutate(("expect",), []),
    "document-a-list": [VALID_PROFILE],  # type: ignore[dict-item]
}

VALID_VARIANTS: dict[str, dict[str, Any]] = {
    "full": VALID_PROFILE,
    "expect-null": mutate(("expect",), None),
    "sysctl-null": mutate(SYSCTL, None),
    "no-comparator": mutate(THP_ENABLED, {"severity": "info", "reason": "report only"}),
    "gpu-count-list": mutate(("match", "gpu_count"), [4, 8]),
    "min-text-with-spaces": mutate((*SYSCTL, "vm.swappiness", "max"), " 10"),
    "range-floats": mutate(("expect", "kernel_cmdline", "intel_idle.max_cstate", "range"), [0.5, 1.5]),
    "version-as-number": mutate(("expect", "driver", "version", "version_min"), 550),
}

EDGE_PROFILES: dict[str, dict[str, Any]] = {
    # YAML `8.0` is a float; JSON Schema counts it as an integer.
    "gpu-count-float": mutate(("match", "gpu_count"), 8.0),
    "gpu-count-float-in-list": mutate(("match", "gpu_count"), [8, 4.0]),
}


def test_there_are_enough_broken_profiles() -> None:
    assert len(BROKEN_PROFILES) >= 15


@pytest.mark.parametrize("name", sorted(BROKEN_PROFILES))
def test_agreement_on_broken_profiles(name: str) -> None:
    """Each document really is invalid per jsonschema, and agent.io.schema rejects it too."""
    reference, ours = agree(shipped_schema(), BROKEN_PROFILES[name])
    assert reference is False, "test case is not actually broken"
    assert ours == reference


@pytest.mark.parametrize("name", sorted(VALID_VARIANTS))
def test_agreement_on_valid_variants(name: str) -> None:
    reference, ours = agree(shipped_schema(), VALID_VARIANTS[name])
    assert reference is True, "test case is not actually valid"
    assert ours == reference


@pytest.mark.parametrize("name", sorted(EDGE_PROFILES))
def test_agreement_on_edge_profiles(name: str) -> None:
    """Documents where JSON's number model matters; only agreement is asserted."""
    reference, ours = agree(shipped_schema(), EDGE_PROFILES[name])
    assert ours == reference


def test_broken_profile_errors_point_at_the_broken_key() -> None:
    """Not just 'invalid': the error path names where the problem is."""
    validator = Validator(shipped_schema())
    cases = {
        "severity-unknown": "expect.thp.enabled.severity",
        "mtu-rule-extra-key": "expect.network.mtu.rdma.mtu",
        "pci-id-upper-case": "match.gpu_pci_ids[0]",
        "sysctl-key-upper-case": "expect.sysctl['VM.swappiness']",
        "range-three-items": "expect.kernel_cmdline['intel_idle.max_cstate'].range",
        "unknown-top-level-key": "expects",
    }
    for name, where in cases.items():
        found = [describe_path(e.path) for e in validator.errors(BROKEN_PROFILES[name])]
        assert found == [where], name
