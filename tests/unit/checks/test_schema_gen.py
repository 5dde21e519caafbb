"""Issue 16, 3: checks declare their profile schema; schema.json and the README table are generated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.apps.cli import schema_gen
from agent.core.model import Severity, Status, Unknown, Unsupported
from agent.io.schema import Validator
from agent.sources.fsroot import LiveFs
from agent.sources.host import read_swap_total_kb
from checks import Check, all_checks
from checks.host_swap import SWAP
from tests.conftest import REPO
from tests.factories import exp, host, node, profile, write_tree


def test_committed_schema_is_generated_from_the_registry() -> None:
    """Regenerate with `python -m agent.apps.cli.schema_gen > profiles/schema.json`."""
    committed = (REPO / "profiles" / "schema.json").read_text(encoding="utf-8")
    assert committed == schema_gen.schema_text(), "profiles/schema.json is stale: regenerate it"


def test_readme_check_table_is_generated_from_the_registry() -> None:
    """Regenerate with `python -m agent.apps.cli.schema_gen --readme`."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme == schema_gen.readme_with_table(readme), "README check table is stale: regenerate it"
    table = readme.split(schema_gen.README_BEGIN)[1].split(schema_gen.README_END)[0]
    assert {c.id for c in all_checks()} <= {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}


def test_host_checks_carry_their_fragments() -> None:
    owned = {c.id: c.expect_path for c in all_checks() if c.schema is not None}
    assert owned["host.swap"] == ("swap", "total_kb")
    assert owned["host.sysctl"] == ("sysctl",)
    assert {i for i in owned if i.startswith("host.")} >= {
        "host.thp.enabled", "host.thp.defrag", "host.numa.balancing", "host.numa.affinity", "host.cpu.governor",
        "host.cpu.cstates", "host.kernel.cmdline", "host.secureboot", "host.driver.version", "host.modules",
        "host.gpu.pci_count", "host.swap"}
    for check in all_checks():
        if check.schema is not None:
            assert check.evidence, f"{check.id} declares a fragment but no evidence"


def test_base_no_longer_holds_migrated_sections() -> None:
    base = json.loads(schema_gen.BASE_PATH.read_text(encoding="utf-8"))
    sections = base["$defs"]["expect"]["properties"]
    assert not {"sysctl", "numa", "cpu", "kernel_cmdline", "secure_boot", "driver", "modules", "gpu_pci",
                "swap"} & set(sections)
    assert sections["thp"]["properties"] == {}  # the section's description stays; its keys come from checks


def _base() -> dict[str, Any]:
    return {"$defs": {"expectation_or_drop": {"type": ["object", "null"]},
                      "expect": {"type": "object", "additionalProperties": False, "properties": {}}}}


def test_generator_places_fragments_and_refuses_a_second_owner() -> None:
    one = Check("t.one", "One", source="host", expect_path=("a", "b"), schema={"$ref": "#/$defs/expectation_or_drop"})
    two = Check("t.two", "Two", source="host", expect_path=("a", "c"), schema={"type": "integer"})
    schema = schema_gen.generate_schema([one, two], _base())
    section = schema["$defs"]["expect"]["properties"]["a"]
    assert section == {"type": ["object", "null"], "additionalProperties": False,
                       "properties": {"b": {"$ref": "#/$defs/expectation_or_drop"}, "c": {"type": "integer"}}}
    validator = Validator({**schema, "$ref": "#/$defs/expect"})
    assert validator.errors({"a": {"b": None, "c": 3}}) == []
    assert validator.errors({"a": {"d": 1}})  # a key no check declared is refused
    again = Check("t.three", "Three", source="host", expect_path=("a", "b"), schema={"type": "string"})
    with pytest.raises(ValueError, match="declared twice"):
        schema_gen.generate_schema([one, again], _base())
    with pytest.raises(ValueError, match="no expect_path"):
        schema_gen.generate_schema([Check("t.x", "X", source="host", schema={"type": "string"})], _base())


# --- host.swap, the worked example ------------------------------------------------------------


HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


@pytest.mark.parametrize(("text", "expected"), [
    (HEADER, 0),
    (HEADER + "/dev/dm-1                               partition\t8388604\t\t1024\t\t-2\n", 8388604),
    (HEADER + "/swap\\040file  file  1048572  0  -2\n/dev/zram0 partition 4194300 0 100\n", 1048572 + 4194300),
])
def test_swap_is_read_from_proc_swaps(tmp_path: Path, text: str, expected: int) -> None:
    write_tree(tmp_path, {"proc/swaps": text})
    assert read_swap_total_kb(LiveFs(str(tmp_path))) == expected


def test_swap_unreadable_or_absent(tmp_path: Path) -> None:
    absent = read_swap_total_kb(LiveFs(str(tmp_path)))
    assert isinstance(absent, Unsupported)  # no evidence either way: skip, never a finding
    write_tree(tmp_path, {"proc/swaps": HEADER + "/dev/sda2 partition lots 0 -2\n"})
    broken = read_swap_total_kb(LiveFs(str(tmp_path)))
    assert isinstance(broken, Unknown) and not isinstance(broken, Unsupported)
    write_tree(tmp_path, {"proc/swaps": "garbage\n"})
    assert isinstance(read_swap_total_kb(LiveFs(str(tmp_path))), Unknown)


def test_swap_check_judges_the_profile_limit() -> None:
    limit = profile({"swap": {"total_kb": exp(max=0)}})
    on = SWAP.run(node(host(swap_total_kb=8388604)), limit)
    assert [(f.status, f.severity, f.observed, f.action) for f in on] == [
        (Status.FAIL, Severity.WARNING, 8388604, "disable_swap")]
    assert [f.status for f in SWAP.run(node(host(swap_total_kb=0)), limit)] == [Status.PASS]
    assert [f.status for f in SWAP.run(node(host(swap_total_kb=Unsupported("absent"))), limit)] == [Status.SKIP]
    assert SWAP.run(node(host(swap_total_kb=0)), profile({})) == []


def test_base_profile_asks_for_swap_off() -> None:
    from agent.policy.profiles import ProfileStore

    base = ProfileStore().profile("generic-nvidia", with_overrides=False)
    expectation = base.expectation("swap", "total_kb")
    assert expectation is not None and expectation.severity is Severity.WARNING


def test_simulated_nodes_record_swap_off() -> None:
    for name in ("hgx-h100-healthy", "hgx-h100-drifted", "dgx-a100-healthy"):
        fs = REPO / "fixtures" / "nodes" / name / "fs"
        assert read_swap_total_kb(LiveFs(str(fs))) == 0, name


def test_live_swap_agrees_with_psutil() -> None:
    """psutil (its SwapTotal, /proc/meminfo) is the oracle on the live path; the source reads
    /proc/swaps through FsRoot so that snapshots replay it (docs/decisions.md)."""
    ours = read_swap_total_kb(LiveFs())
    assert not isinstance(ours, Unknown)
    assert ours * 1024 == psutil.swap_memory().total


def test_every_check_says_what_counts_as_evidence() -> None:
    """The README's check reference (issue 13): per check, what is evidence and what is a placeholder."""
    from checks import all_checks

    assert [c.id for c in all_checks() if not c.evidence.strip()] == []
