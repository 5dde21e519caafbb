"""Issue 13, rules 6-8: how GPU (and IB) readings are judged, not just read.

Rule 6: a counter at its field's maximum is a lower bound (the true count is at least that): it fails a
limit below the maximum and is `unknown` only against a limit at or above it, in the one shared
comparison (agent.core.expect / Check.compare) that every counter check goes through.
Rule 7: requested, enforced, default and max power limits stay apart; an enforced limit below the
requested one is a clamp by something else, and the finding says what is known about who.
Rule 8: temperatures are compared only among GPUs under the same load.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.core.expect import Expectation
from agent.core.facts import BmcFacts, BmcPsu, GpuFacts, NodeFacts, NvmlFacts, RdmaDevice, RdmaPort
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.importers.nvidia_smi import parse_nvidia_smi
from agent.sources.nvml import RecordedNvml, read_nvml
from checks import Check
from checks.gpu_ecc import CORRECTED, RETIRED, ROW_REMAP, UNCORRECTED
from checks.gpu_nvlink import ERRORS
from checks.gpu_pcie import REPLAY
from checks.gpu_power import CLOCK_EVENTS, POWER_LIMIT
from checks.gpu_thermal import IMBALANCE
from checks.ib import PORT_ERRORS
from tests.conftest import REPO
from tests.factories import exp, gpu_facts, host, node, nvml_node, profile

M4, M8, M16, M32, M64 = 15, 255, 65535, 4294967295, 18446744073709551615
POWER_BRAKE_DUMP = REPO / "fixtures" / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
COUNTER = Check("test.counter", "a counter (not registered)", source="nvml")


@pytest.fixture(scope="module")
def h100() -> Profile:
    return ProfileStore().profile("hgx-h100-sxm")


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def one(facts: NodeFacts, prof: Profile, check: Check, subject: str = "gpu0") -> Finding:
    return by_subject(check.run(facts, prof))[subject]


def expectation(**comparators: Any) -> Expectation:
    return Expectation.from_mapping(exp(**comparators))


def dump_gpus(text: str) -> tuple[GpuFacts, ...]:
    """nvidia-smi text -> importer -> nvml.json (JSON round trip) -> the real reader, as the audit reads it."""
    facts, status = read_nvml(RecordedNvml(json.loads(json.dumps(parse_nvidia_smi(text, "dump")))), initialized=True)
    assert status.ok and isinstance(facts, NvmlFacts), status.error
    return facts.gpus


# --- rule 6: counters ------------------------------------------------------------------------------------
# Old code: Check.compare had no `bits` (TypeError); a GPU counter at its maximum passed a limit at or above
# it; an IB counter at its maximum was always `unknown`, even against a limit far below it.


@pytest.mark.parametrize(("bits", "maximum"), [(4, M4), (8, M8), (16, M16), (32, M32), (64, M64)])
@pytest.mark.parametrize(("offset", "status"), [(-1, Status.FAIL), (0, Status.UNKNOWN), (1, Status.UNKNOWN)])
def test_a_counter_at_its_widths_maximum(bits: int, maximum: int, offset: int, status: Status) -> None:
    """Limit below the maximum: fail (the true count is at least the maximum); at or above it: unknown."""
    assert maximum == (1 << bits) - 1
    finding = COUNTER.compare("x", expectation(max=maximum + offset), maximum, "errors", bits=bits)
    assert finding.status is status and finding.observed == maximum
    if status is Status.FAIL:
        assert f"is at least {maximum}" in finding.message and f"{bits}-bit maximum" in finding.message
    else:
        assert "cannot be told" in finding.message and f"{bits}-bit maximum {maximum}" in finding.message


@pytest.mark.parametrize(("bits", "maximum"), [(4, M4), (8, M8), (16, M16), (32, M32), (64, M64)])
def test_below_the_maximum_a_counter_is_an_ordinary_value(bits: int, maximum: int) -> None:
    assert COUNTER.compare("x", expectation(max=maximum - 1), maximum - 1, "errors", bits=bits).status is Status.PASS
    below = COUNTER.compare("x", expectation(max=maximum - 2), maximum - 1, "errors", bits=bits)
    assert below.status is Status.FAIL and "at least" not in below.message
    # a floor passes a minimum it already meets; an informational limit only warns
    assert COUNTER.compare("x", expectation(min=3), maximum, "errors", bits=bits).status is Status.PASS
    info = Expectation.from_mapping(exp("info", max=0))
    assert COUNTER.compare("x", info, maximum, "errors", bits=bits).status is Status.WARN


def test_gpu_counters_saturated_at_their_nvml_width(h100: Profile) -> None:
    """ECC and NVLink counts are 64-bit in NVML, retired pages, remapped rows and PCIe replays 32-bit."""
    saturated = gpu_facts(0, ecc_volatile_uncorrected=M64, ecc_aggregate_corrected=M64, remapped_uncorrectable=M32,
                          pcie_replays=M32, retired_sbe=M32, retired_dbe=0, retired_pending=False,
                          nvlink_errors={"crc_flit": 0, "crc_data": 0, "replay": M64, "recovery": 0})
    facts = nvml_node([saturated])
    for check in (UNCORRECTED, CORRECTED, ROW_REMAP, REPLAY, RETIRED, ERRORS):  # the shipped limits are far below
        finding = one(facts, h100, check)
        assert finding.status is Status.FAIL and "is at least" in finding.message, (check.id, finding.message)
    # limits at the maximum: the true count may be above them, so nothing can be told (old code: pass)
    at_max = profile({"gpu": {"ecc": {"uncorrected": exp("critical", max=M64), "corrected": exp(max=M64)},
                              "retired_pages": exp(max=M32), "row_remap": {"uncorrectable": exp(max=M32)},
                              "pcie": {"replay_rate": exp(max=10**12)}, "nvlink": {"errors": exp(max=M64)}}})
    for check in (UNCORRECTED, CORRECTED, ROW_REMAP, REPLAY, RETIRED, ERRORS):
        finding = one(facts, at_max, check)
        assert finding.status is Status.UNKNOWN and "maximum" in finding.message, (check.id, finding.message)
    # a total with a saturated part is at least the sum: 2^32-1 + 1 retired pages is over a 2^32-1 limit
    over = nvml_node([saturated._replace(retired_dbe=1)])
    assert one(over, at_max, RETIRED).status is Status.FAIL
    # one below the maximum is an ordinary reading
    plain = nvml_node([gpu_facts(0, remapped_uncorrectable=M32 - 1)])
    assert one(plain, at_max, ROW_REMAP).status is Status.PASS


def ib_node(counters: dict[str, int | str]) -> NodeFacts:
    port = RdmaPort(1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand", counters)
    return node(host(rdma=(RdmaDevice("mlx5_0", "MT4129", "MT_0000000838", "28.39.2048", "0000:1a:00.0", (port,)),)))


@pytest.mark.parametrize(("name", "bits", "maximum"), [
    ("local_link_integrity_errors", 4, M4), ("link_downed", 8, M8), ("symbol_error", 16, M16)])
def test_ib_pma_counters_saturated_at_their_width(name: str, bits: int, maximum: int) -> None:
    def judged(limit: int) -> Finding:
        (finding,) = PORT_ERRORS.run(ib_node({name: maximum}), profile({"rdma": {"errors": {name: exp(max=limit)}}}))
        return finding

    below = judged(maximum - 1)  # old code: unknown
    assert below.status is Status.FAIL and f"{name} at least {maximum} ({bits}-bit maximum" in below.message
    assert below.observed == {name: maximum}
    for limit in (maximum, maximum + 1):
        finding = judged(limit)
        assert finding.status is Status.UNKNOWN and "perfquery -R" in finding.message
    assert judged(maximum).status is Status.UNKNOWN
    (ordinary,) = PORT_ERRORS.run(ib_node({name: maximum - 1}), profile({"rdma": {"errors": {name: exp(max=maximum)}}}))
    assert ordinary.status is Status.PASS


# --- rule 7: power limits ---------------------------------------------------------------------------------
# Old code compared only the requested limit with the default: every clamp below passed silently.


def test_an_enforced_limit_below_the_requested_one_is_a_clamp_by_someone_else(h100: Profile) -> None:
    clamped = one(nvml_node([gpu_facts(0, enforced_limit_w=500.0)]), h100, POWER_LIMIT)
    assert clamped.status is Status.FAIL and clamped.severity is Severity.WARNING
    assert "held at 500 W: below its requested 700 W (default 700 W, max 700 W)" in clamped.message
    assert "platform or BMC power cap" in clamped.message and clamped.action == "check_platform_power_cap"
    assert clamped.remediation is None  # setting the requested limit again would change nothing
    assert clamped.observed == {"requested_w": 700.0, "enforced_w": 500.0, "default_w": 700.0, "max_w": 700.0}
    assert clamped.expected == {"min": 700}
    # the driver holding clocks at that limit, and the BMC's PSU view, are quoted as clues
    bmc = BmcFacts("redfish", psus=(BmcPsu("PSU3", "Enabled", "Critical"), BmcPsu("PSU4", "Absent", None),
                                    BmcPsu("PSU1", "Enabled", "OK")))
    capping = nvml_node([gpu_facts(0, enforced_limit_w=500.0, clock_events=0x4)], bmc=bmc)
    message = one(capping, h100, POWER_LIMIT).message
    assert "SW power cap is active" in message and "the BMC reports PSU3 Critical" in message
    assert "PSU4" not in message and "PSU1" not in message
    # under the power brake, the platform clamps
    braked = one(nvml_node([gpu_facts(0, enforced_limit_w=500.0, clock_events=0x88)]), h100, POWER_LIMIT)
    assert "the platform asserts the power brake" in braked.message and braked.action == "check_power_delivery"
    # a limit raised above the default but enforced at the default is clamped too
    raised = gpu_facts(0, power_limit_w=700.0, default_limit_w=600.0, enforced_limit_w=600.0)
    assert one(nvml_node([raised]), h100, POWER_LIMIT).status is Status.FAIL
    # requested unreadable: the enforced limit is judged against the default
    unreadable = gpu_facts(0, power_limit_w=Unknown("nvmlDeviceGetPowerManagementLimit: Unknown Error"),
                           enforced_limit_w=500.0)
    finding = one(nvml_node([unreadable]), h100, POWER_LIMIT)
    assert finding.status is Status.FAIL and "held at 500 W" in finding.message and finding.expected == {"min": 700}


def test_a_requested_limit_below_the_default_is_this_hosts_setting_not_a_clamp(h100: Profile) -> None:
    lowered = one(nvml_node([gpu_facts(0, power_limit_w=500.0, enforced_limit_w=500.0)]), h100, POWER_LIMIT)
    assert lowered.status is Status.FAIL and lowered.remediation == "gpu_power_limit"
    assert lowered.message.startswith("GPU 0 (0000:19:00.0) requested power limit (W) is 500.0")
    assert "default 700 W: the GPU is capped" in lowered.message and "clamps" not in lowered.message
    healthy = one(nvml_node(), h100, POWER_LIMIT)
    assert healthy.status is Status.PASS and healthy.observed == 700.0
    assert healthy.message == "GPU 0 (0000:19:00.0) requested power limit (W) is 700.0, enforced 700 W"
    no_enforced = one(nvml_node([gpu_facts(0, enforced_limit_w=Unknown("no answer"))]), h100, POWER_LIMIT)
    assert no_enforced.status is Status.PASS and "enforced power limit (W): no answer" in no_enforced.message


def test_grace_hopper_module_power_limit_names_the_module(h100: Profile) -> None:
    module = gpu_facts(0, enforced_limit_w=450.0, module_limit_w=900.0, module_requested_limit_w=900.0)
    finding = one(nvml_node([module]), h100, POWER_LIMIT)
    assert finding.status is Status.FAIL and "module power limit (900 W for CPU, GPU and memory" in finding.message
    assert finding.action == "check_module_power_limit"
    assert finding.observed["module_w"] == 900.0
    capped = module._replace(module_requested_limit_w=1000.0)
    finding = one(nvml_node([capped]), h100, POWER_LIMIT)
    assert "the platform or BMC: the Grace Hopper module limit is held at 900 W, below its requested 1000 W" in (
        finding.message)


def test_module_power_readings_come_from_the_dump_and_the_reader() -> None:
    text = POWER_BRAKE_DUMP.read_text(encoding="utf-8")
    gh = text.replace("        Current Power Limit               : 700.00 W", "        Current Power Limit               "
                      ": 450.00 W", 1)
    gh = gh.replace("""    Module Power Readings
        Power Draw                        : N/A
        Current Power Limit               : N/A
        Requested Power Limit             : N/A""", """    Module Power Readings
        Power Draw                        : 610.00 W
        Current Power Limit               : 900.00 W
        Requested Power Limit             : 1000.00 W""", 1)
    gpus = dump_gpus(gh)
    assert (gpus[0].power_limit_w, gpus[0].enforced_limit_w) == (700.0, 450.0)
    assert (gpus[0].module_limit_w, gpus[0].module_requested_limit_w) == (900.0, 1000.0)
    assert "not supported" in gpus[1].module_limit_w.reason  # type: ignore[union-attr]  # N/A on an HGX H100
    finding = one(nvml_node(list(gpus)), ProfileStore().profile("hgx-h100-sxm"), POWER_LIMIT)
    assert finding.status is Status.FAIL and "module limit is held at 900 W" in finding.message


def test_the_idle_power_brake_dump_names_the_platform_and_bmc(h100: Profile) -> None:
    """gpud 535.161.08: 8x H100 with HW Power Brake Slowdown active on every GPU at idle, limits untouched."""
    gpus = dump_gpus(POWER_BRAKE_DUMP.read_text(encoding="utf-8"))
    facts = nvml_node(list(gpus))
    events = CLOCK_EVENTS.run(facts, h100)
    assert [f.subject for f in events] == [f"gpu{i}" for i in range(8)]
    for finding in events:
        assert finding.status is Status.FAIL and finding.severity is Severity.CRITICAL
        assert finding.action == "check_power_delivery"
        assert "likely clamp: the platform asserts the power brake" in finding.message
        assert "driven by the BMC or the power-delivery logic" in finding.message
        assert "on all 8 GPUs at once: a node power-delivery fault" in finding.message
        assert "while idle (0 % utilization" in finding.message
    assert "67.74 W of 700 W" in events[0].message
    limits = POWER_LIMIT.run(facts, h100)
    assert {f.status for f in limits} == {Status.PASS}  # requested = enforced = default = 700 W
    assert all("the platform's HW power brake does" in f.message for f in limits)
    # one GPU braked under load: no node-wide or idle claim
    busy = [gpu_facts(0, clock_events=0x88, utilization_gpu_pct=97, power_w=610.0)] + [gpu_facts(i) for i in (1, 2)]
    (finding,) = [f for f in CLOCK_EVENTS.run(nvml_node(busy), h100) if f.status is Status.FAIL]
    assert "likely clamp: the platform" in finding.message
    assert "on all" not in finding.message and "while idle" not in finding.message


# --- rule 8: thermal imbalance under the same load ----------------------------------------------------------
# Old code compared every GPU with the node's median, whatever its load.


def test_a_busy_gpu_hotter_than_idle_peers_is_not_an_imbalance(h100: Profile) -> None:
    gpus = [gpu_facts(0, temperature_c=62, utilization_gpu_pct=98, power_w=640.0)] + [gpu_facts(i) for i in range(1, 8)]
    result = by_subject(IMBALANCE.run(nvml_node(gpus), h100))  # old code: gpu0 fails, +28 C over the median
    assert result["gpu0"].status is Status.SKIP and "no other GPU is under the same load" in result["gpu0"].message
    assert {result[f"gpu{i}"].status for i in range(1, 8)} == {Status.PASS}
    # two busy GPUs are compared with each other, the idle ones with each other
    pair = [gpu_facts(i, temperature_c=61 + i, utilization_gpu_pct=95, power_w=600.0 + i) for i in (0, 1)]
    result = by_subject(IMBALANCE.run(nvml_node(pair + [gpu_facts(i) for i in range(2, 8)]), h100))
    assert {f.status for f in result.values()} == {Status.PASS}
    assert "of the 2 GPUs under the same load (86 % of their power limits, 95 % utilization)" in result["gpu0"].message
    # utilization alone separates them when power draw cannot be read
    no_power = [gpu_facts(0, temperature_c=62, utilization_gpu_pct=100, power_w=Unknown("x"))] + [
        gpu_facts(i, power_w=Unknown("x")) for i in range(1, 8)]
    assert by_subject(IMBALANCE.run(nvml_node(no_power), h100))["gpu0"].status is Status.SKIP
    # a GPU whose load cannot be read is not compared, and says so
    blind = gpu_facts(0, temperature_c=62, utilization_gpu_pct=Unknown("x"), power_w=Unknown("x"))
    result = by_subject(IMBALANCE.run(nvml_node([blind] + [gpu_facts(i) for i in range(1, 8)]), h100))
    assert result["gpu0"].status is Status.UNKNOWN and "cannot be read" in result["gpu0"].message


def test_equal_load_imbalance_is_still_found(h100: Profile) -> None:
    # Under equal heavy load the hot GPU is found among its busy peers, and the idle half does not drag the
    # median down onto the others (old code: 4, 5 and 6 failed too, +18 C over a median of 52 C).
    idle = [gpu_facts(i, temperature_c=34) for i in range(4)]
    busy = [gpu_facts(i, temperature_c=t, utilization_gpu_pct=100, power_w=650.0 + i)
            for i, t in zip(range(4, 8), (70, 70, 71, 80), strict=True)]
    result = by_subject(IMBALANCE.run(nvml_node(idle + busy), h100))
    assert {s for s, f in result.items() if f.status is Status.FAIL} == {"gpu7"}
    assert result["gpu7"].observed == 9.5 and "median (70.5 C) of the 4 GPUs" in result["gpu7"].message
    # The seed case (fixtures/nodes/hgx-h100-drifted): GPUs 5-8 at the same idle load, the hot ones ~10 C
    # above GPUs 1-4 (GPU 8 fell off the bus): GPUs 5 and 6 are more than 8 C above the median.
    temps, watts = (34, 33, 35, 34, 44, 45, 43), (69.874, 68.412, 71.236, 70.118, 74.153, 75.641, 75.287)
    gpus = [gpu_facts(i, temperature_c=t, power_w=w) for i, (t, w) in enumerate(zip(temps, watts, strict=True))]
    lost = GpuFacts(index=7, lost="nvmlDeviceGetHandleByIndex: GPU is lost")
    result = by_subject(IMBALANCE.run(nvml_node([*gpus, lost]), h100))
    assert {s for s, f in result.items() if f.status is Status.FAIL} == {"gpu4", "gpu5"}
    assert result["gpu4"].observed == 9 and "of the 7 GPUs under the same load" in result["gpu4"].message
    assert "fans or blocked flow" in result["gpu4"].message


def test_load_groups_do_not_chain_and_the_profile_sets_what_same_load_means(h100: Profile) -> None:
    # 10, 18, 26, 34 % of a 700 W limit: neighbours are within 10 points, the ends are not
    gpus = [gpu_facts(i, temperature_c=40 + i, power_w=70.0 + 56.0 * i) for i in range(4)]
    result = by_subject(IMBALANCE.run(nvml_node(gpus), h100))
    assert "of the 2 GPUs under the same load (10-18 %" in result["gpu0"].message
    assert "of the 2 GPUs under the same load (26-34 %" in result["gpu2"].message
    wide = profile({"gpu": {"thermal_imbalance": {**exp(max=8), "same_load_power_pct": 100,
                                                   "same_load_utilization_pct": 100}}})
    busy = [gpu_facts(0, temperature_c=62, utilization_gpu_pct=98, power_w=640.0)] + [gpu_facts(i) for i in range(1, 8)]
    assert by_subject(IMBALANCE.run(nvml_node(busy), wide))["gpu0"].status is Status.FAIL
