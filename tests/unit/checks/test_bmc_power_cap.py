"""Issue 31.5: a BMC power cap judged by its numbers. A real Dell iDRAC answer (telegraf's fixture) caps a
node rated 1628 W at 348 W with LimitException HardPowerOff while it draws 429 W: a warning saying so;
no cap (Lenovo, LimitInWatts null) and a disabled Cray `#Control` pass; a cap far below the rating warns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.core.facts import BmcFacts, NodeFacts
from agent.core.model import Status
from agent.policy.profiles import ProfileStore
from agent.sources.redfish import RecordedRedfish, Walk, parse_bmc
from checks.bmc_power import POWER_CAP
from tests.conftest import REPO
from tests.factories import host

SINGLE = REPO / "fixtures" / "redfish" / "single"
BLADE = REPO / "fixtures" / "redfish" / "cray-ex425-amd-milan-blade" / "redfish" / "v1" / "Chassis"


def parse(resources: dict[str, dict[str, Any]]) -> BmcFacts:
    walk = Walk(RecordedRedfish(Path("/nonexistent")))
    walk.resources = {"/redfish/v1": {"RedfishVersion": "1.6.0", "Vendor": "Test"}, **resources}
    return parse_bmc(walk)


def judged(bmc: BmcFacts) -> dict[str, Any]:
    findings = POWER_CAP.run(NodeFacts(host=host(), kmsg=(), bmc=bmc), ProfileStore().profile("generic-nvidia"))
    return {f.subject: f for f in findings}


def test_a_hard_power_off_cap_warns_with_its_numbers() -> None:
    dell = json.loads((SINGLE / "telegraf/dell/dell_power.json").read_text())
    [finding] = judged(parse({"/redfish/v1/Chassis/System.Embedded.1/Power": dell})).values()
    assert finding.status is Status.WARN
    assert all(text in finding.message for text in ("348 W", "1628 W", "HardPowerOff", "429 W")), finding.message


def test_no_cap_and_a_disabled_control_pass() -> None:
    lenovo = json.loads((SINGLE / "bmclib/providers_lenovo__v1_power.json").read_text())
    [finding] = judged(parse({"/redfish/v1/Chassis/1/Power": lenovo})).values()
    assert finding.status is Status.PASS and "no power cap set" in finding.message
    control = json.loads((BLADE / "Node0/Controls/NodePowerLimit/index.json").read_text())
    [finding] = judged(parse({"/redfish/v1/Chassis/Node0/Controls/NodePowerLimit": control})).values()
    assert finding.status is Status.PASS and "no power cap set" in finding.message


def test_a_cap_far_below_the_rating_warns_and_a_fitting_one_passes() -> None:
    lenovo = json.loads((SINGLE / "bmclib/providers_lenovo__v1_power.json").read_text())
    for watts, status in ((500, Status.WARN), (1500, Status.PASS)):
        lenovo["PowerControl"][0]["PowerLimit"] = {"LimitInWatts": watts, "LimitException": "LogEventOnly"}
        [finding] = judged(parse({"/redfish/v1/Chassis/1/Power": lenovo})).values()
        assert finding.status is status, finding.message
    assert "28% of the platform's 1800 W" in judged(parse({"/redfish/v1/Chassis/1/Power": {
        **lenovo, "PowerControl": [{**lenovo["PowerControl"][0],
                                    "PowerLimit": {"LimitInWatts": 500, "LimitException": "NoAction"}}]}}))[
        "Server Power Control"].message


# --- issue 31.6: SimpleStorage devices judged like Storage drives ------------------------------------------

LAMBDA = REPO / "fixtures" / "real" / "redfish" / "lambdalabs-exporter-fixtures" / "hack-sampleOut"


def test_simple_storage_devices_are_drives_and_a_failed_one_is_judged() -> None:
    from checks.bmc_storage import DRIVES

    simple = json.loads((LAMBDA / "simple_storage_1.json").read_text())
    bmc = parse({"/redfish/v1/Systems/1/SimpleStorage/1": simple})
    assert isinstance(bmc.drives, tuple) and [d.model for d in bmc.drives] == ["ST16000NM001G-2K"] * 2
    simple["Devices"][1]["Status"]["Health"] = "Critical"
    failed = parse({"/redfish/v1/Systems/1/SimpleStorage/1": simple})
    findings = DRIVES.run(NodeFacts(host=host(), kmsg=(), bmc=failed), ProfileStore().profile("generic-nvidia"))
    bad = [f for f in findings if f.status is Status.FAIL]
    assert len(bad) == 1 and bad[0].subject == "drive 1" and "Critical" in bad[0].message, [f.message for f in findings]
