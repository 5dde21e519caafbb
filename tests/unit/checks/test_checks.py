"""Each check as a pure function: hand-made facts + profile -> exact findings."""

from __future__ import annotations

import pytest

from agent.core.facts import CpuFacts, IdleState, ProfileMatch
from agent.core.model import Finding, Severity, SourceStatus, Status, Unknown
from checks import all_checks
from checks.host_cpu import CSTATES, GOVERNOR, cpu_ranges
from checks.host_driver import DRIVER
from checks.host_gpu_pci import PCI_COUNT
from checks.host_kernel import CMDLINE
from checks.host_modules import MODULES
from checks.host_numa import AFFINITY, BALANCING
from checks.host_secureboot import SECUREBOOT
from checks.host_sysctl import SYSCTL
from checks.host_thp import THP_DEFRAG, THP_ENABLED
from checks.net_mtu import MTU
from checks.profile_match import PROFILE_MATCH
from checks.sources import SOURCE
from tests.factories import exp, gpu, host, iface, nic, node, profile

EXPECTED_IDS = {
    "host.sysctl", "host.thp.enabled", "host.thp.defrag", "host.numa.balancing", "host.numa.affinity",
    "net.mtu", "host.cpu.governor", "host.cpu.cstates", "host.cpu.offline", "bmc.power_cap", "bmc.voltages", "host.kernel.cmdline", "host.kernel.events",
    "history.gpu", "history.node", "history.counters",
    "host.secureboot", "host.swap",
    "accept.load", "accept.power", "accept.temperature.spread", "accept.thermal.resistance", "accept.thermal.siblings",
    "accept.clocks.events", "accept.clocks.sm", "accept.memory.temperature", "accept.psu", "accept.errors",
    "accept.gpu.lost",
    "accept.drift",
    "host.driver.version", "host.modules", "host.gpu.pci_count", "profile.match", "source.available",
    "gpu.count", "gpu.lost", "gpu.ecc.mode", "gpu.ecc.uncorrected", "gpu.ecc.corrected", "gpu.retired_pages",
    "gpu.row_remap", "gpu.persistence_mode", "gpu.compute_mode", "gpu.app_clocks", "gpu.mig_mode", "gpu.power.limit",
    "gpu.clocks.events", "gpu.temperature", "gpu.memory_temperature", "gpu.thermal.imbalance", "gpu.pcie.link",
    "gpu.pcie.replay", "gpu.nvlink.links", "gpu.nvlink.errors", "gpu.fabric", "gpu.firmware.vbios", "gpu.inforom",
    "gpu.driver", "gpu.cuda", "gpu.xid", "gpu.recovery_action",
    "ib.hca.count", "ib.port.state", "ib.port.rate", "ib.port.errors", "ib.firmware", "pcie.link", "pcie.acs",
    "host.iommu", "topology.gpu_nic",
    "bmc.reachable", "bmc.health_rollup", "bmc.psu", "bmc.fans", "bmc.temperatures", "bmc.leak", "bmc.firmware",
    "bmc.storage.drives", "bmc.storage.media_life", "bmc.storage.volumes",
    "firmware.consistency", "bmc.events", "bios.attribute", "bmc.switches", "crosscheck.gpu_count", "crosscheck.gpu_views", "crosscheck.gpu_temperature",
    "crosscheck.gpu_health", "crosscheck.hgx_gpu_health", "crosscheck.identity", "baseline.drift",
    "fabric.manager", "fabric.nvswitch.count", "fabric.sxid",
}


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def test_registry_holds_the_documented_stable_ids() -> None:
    checks = all_checks()
    assert {c.id for c in checks} == EXPECTED_IDS
    for check in checks:
        assert check.title and check.source in {"host", "nvml", "bmc", "kmsg", "crosscheck", "ledger"}


def test_sysctl_min_passes_higher_values_and_fails_lower() -> None:
    prof = profile({"sysctl": {"net.core.rmem_max": exp(min=134217728),
                               "vm.zone_reclaim_mode": exp(equals=0)}})
    good = by_subject(SYSCTL.run(node(), prof))
    assert good["net.core.rmem_max"].status is Status.PASS
    assert good["net.core.rmem_max"].observed == "268435456"
    facts = node(host(sysctl={"net.core.rmem_max": "4194304", "vm.zone_reclaim_mode": "1"}))
    bad = by_subject(SYSCTL.run(facts, prof))
    assert bad["net.core.rmem_max"].status is Status.FAIL
    assert bad["net.core.rmem_max"].message == "sysctl net.core.rmem_max is 4194304, expected >= 134217728"
    assert bad["net.core.rmem_max"].reason == "test reason"
    assert bad["net.core.rmem_max"].remediation == "sysctl"
    assert bad["vm.zone_reclaim_mode"].status is Status.FAIL


def test_sysctl_unreadable_is_unknown_with_reason() -> None:
    prof = profile({"sysctl": {"net.core.rmem_max": exp(min=1)}})
    facts = node(host(sysctl={"net.core.rmem_max": Unknown("/proc/sys/net/core/rmem_max is absent")}))
    (finding,) = SYSCTL.run(facts, prof)
    assert finding.status is Status.UNKNOWN
    assert "/proc/sys/net/core/rmem_max is absent" in finding.message
    assert finding.remediation is None


@pytest.mark.parametrize(("observed", "status"), [("madvise", Status.PASS), ("never", Status.PASS),
                                                  ("always", Status.FAIL)])
def test_thp_enabled(observed: str, status: Status) -> None:
    prof = profile({"thp": {"enabled": exp(one_of=["madvise", "never"])}})
    (finding,) = THP_ENABLED.run(node(host(thp_enabled=observed)), prof)
    assert finding.status is status and finding.observed == observed


def test_thp_defrag_unknown_and_absent_expectation() -> None:
    prof = profile({"thp": {"defrag": exp(one_of=["madvise"])}})
    (finding,) = THP_DEFRAG.run(node(host(thp_defrag=Unknown("unexpected content"))), prof)
    assert finding.status is Status.UNKNOWN
    assert THP_ENABLED.run(node(), prof) == []


def test_numa_balancing_reads_the_sysctl() -> None:
    prof = profile({"numa": {"balancing": exp(equals=0)}})
    (finding,) = BALANCING.run(node(host(sysctl={"kernel.numa_balancing": "1"})), prof)
    assert finding.status is Status.FAIL and finding.observed == "1"


def test_numa_affinity_classifies_each_gpu() -> None:
    prof = profile({"numa": {"affinity": exp(one_of=["local", "single-node", "no-rdma-nic"])}})
    results = by_subject(AFFINITY.run(node(), prof))
    assert {s: f.observed for s, f in results.items()} == {"gpu0": "local", "gpu1": "local"}
    # Both NICs on node 0: the GPU on node 1 crosses the socket interconnect.
    remote = host(pci=(gpu("0000:19:00.0", 0), gpu("0000:9b:00.0", 1), nic("0000:1a:00.0", 0),
                       nic("0000:9c:00.0", 0)))
    results = by_subject(AFFINITY.run(node(remote), prof))
    assert results["gpu1"].status is Status.FAIL and results["gpu1"].observed == "remote"
    assert "RDMA NICs sit on NUMA node(s) [0]" in results["gpu1"].message
    unknown_node = host(pci=(gpu("0000:19:00.0", None), nic("0000:1a:00.0", 0)))
    (finding,) = AFFINITY.run(node(unknown_node), prof)
    assert finding.observed == "firmware-unknown" and finding.status is Status.FAIL
    single = host(numa_nodes=(0,))
    assert {f.observed for f in AFFINITY.run(node(single), prof)} == {"single-node"}
    no_rdma = host(interfaces=(iface("eno1", driver="tg3", pci_address="0000:01:00.0"),))
    assert {f.observed for f in AFFINITY.run(node(no_rdma), prof)} == {"no-rdma-nic"}


MTU_RULES = {"network": {"mtu": {"roce": {"match": {"driver": ["mlx5_core"], "link_layer": ["Ethernet"],
                                                    "rdma": True},
                                          "expect": exp(min=9000)}}}}


def test_mtu_rule_matches_roce_ports_only() -> None:
    facts = host(interfaces=(
        iface("enp26s0np0", mtu=1500, driver="mlx5_core", pci_address="0000:1a:00.0", rdma_device="mlx5_0",
              link_layer="Ethernet"),
        iface("ibp1s0", mtu=4092, driver="mlx5_core", pci_address="0000:2a:00.0", rdma_device="mlx5_1",
              link_layer="InfiniBand", arp_type=32),
        iface("eno1", mtu=1500, driver="tg3", pci_address="0000:01:00.0"),
        iface("enp27s0f0np0", mtu=1500, driver="mlx5_core", pci_address="0000:1b:00.0", rdma_device="mlx5_2",
              link_layer="Ethernet", bond_master="bond0"),
        iface("lo", mtu=65536),
    ))
    findings = MTU.run(node(facts), profile(MTU_RULES))
    assert [(f.subject, f.status) for f in findings] == [("enp26s0np0", Status.FAIL)]
    assert findings[0].message == "MTU of enp26s0np0 (mlx5_core, rule roce) is 1500, expected >= 9000"


def test_mtu_rule_names_glob_and_bond_members() -> None:
    rules = {"network": {"mtu": {"all": {"match": {"names": ["enp*"], "bond_members": True},
                                         "expect": exp(equals=9000)}}}}
    facts = host(interfaces=(iface("enp1", mtu=9000), iface("enp2", mtu=1500, bond_master="bond0"),
                             iface("eth0", mtu=1500)))
    statuses = {f.subject: f.status for f in MTU.run(node(facts), profile(rules))}
    assert statuses == {"enp1": Status.PASS, "enp2": Status.FAIL}


def test_mtu_unknown_interfaces() -> None:
    facts = host(interfaces=Unknown("/sys/class/net is absent"))
    (finding,) = MTU.run(node(facts), profile(MTU_RULES))
    assert finding.status is Status.UNKNOWN and "/sys/class/net is absent" in finding.message


def test_governor_mixed_lists_the_offending_cpus() -> None:
    prof = profile({"cpu": {"governor": exp(equals="performance")}})
    cpu = host().cpu._replace(governors={"performance": (0, 1, 2, 5), "powersave": (3, 4, 6)})
    (finding,) = GOVERNOR.run(node(host(cpu=cpu)), prof)
    assert finding.status is Status.FAIL
    assert "powersave on CPUs 3-4,6" in finding.message
    assert finding.observed == {"performance": "0-2,5", "powersave": "3-4,6"}
    assert cpu_ranges((0, 1, 2, 7, 9, 10)) == "0-2,7,9-10"


def test_governor_without_cpufreq_is_unknown() -> None:
    prof = profile({"cpu": {"governor": exp(equals="performance")}})
    cpu = host().cpu._replace(governors=Unknown("no cpufreq driver"))
    (finding,) = GOVERNOR.run(node(host(cpu=cpu)), prof)
    assert finding.status is Status.UNKNOWN and "no cpufreq driver" in finding.message


def test_cstates_deepest_enabled_state() -> None:
    prof = profile({"cpu": {"cstates": exp(max=2)}})
    (ok,) = CSTATES.run(node(), prof)
    assert ok.status is Status.PASS and ok.observed == 1  # C6 is disabled on all 4 CPUs
    states = (IdleState(1, "C1", 1, 0, 4), IdleState(3, "C6", 290, 3, 4))  # C6 still on one CPU
    cpu = CpuFacts((0, 1, 2, 3), {"performance": (0, 1, 2, 3)}, "intel_pstate", "intel_idle", states)
    (bad,) = CSTATES.run(node(host(cpu=cpu)), prof)
    assert bad.status is Status.FAIL and bad.observed == 290
    assert "C6" in bad.message and "enabled on 1 of 4 CPUs" in bad.message


@pytest.mark.parametrize(("cmdline", "observed", "status"), [
    ("ro iommu=pt", "pt", Status.PASS),
    ("ro iommu=on", "on", Status.FAIL),
    ("ro quiet", "absent", Status.FAIL),
    ('ro iommu=pt -- iommu=off', "pt", Status.PASS),  # after "--" the words belong to init
])
def test_kernel_cmdline(cmdline: str, observed: str, status: Status) -> None:
    prof = profile({"kernel_cmdline": {"iommu": exp(equals="pt")}})
    (finding,) = CMDLINE.run(node(host(cmdline=cmdline)), prof)
    assert (finding.observed, finding.status) == (observed, status)
    if status is Status.FAIL:
        assert finding.action == "reboot"


def test_kernel_cmdline_bare_flag_is_present() -> None:
    prof = profile({"kernel_cmdline": {"nosmt": exp(equals="present")}})
    (finding,) = CMDLINE.run(node(host(cmdline="ro nosmt")), prof)
    assert finding.status is Status.PASS


def test_secure_boot_info_severity_only_warns() -> None:
    prof = profile({"secure_boot": exp("info", one_of=["enabled", "disabled"])})
    (finding,) = SECUREBOOT.run(node(host(secure_boot="unsupported")), prof)
    assert finding.status is Status.WARN and finding.severity is Severity.INFO


@pytest.mark.parametrize(("version", "status"), [("550.90.07", Status.PASS), ("550.54.15", Status.PASS),
                                                 ("535.129.03", Status.FAIL), ("560.35.03", Status.FAIL)])
def test_driver_minimum_and_pin(version: str, status: Status) -> None:
    prof = profile({"driver": {"version": exp(version_min="550.54.15", one_of=["550.54.15", "550.90.07"])}})
    (finding,) = DRIVER.run(node(host(nvidia_driver=version)), prof)
    assert finding.status is status


def test_modules_loaded_absent_unknown() -> None:
    prof = profile({"modules": {"nvidia": exp("critical", equals="loaded"),
                                "nvidia_peermem": exp(equals="loaded")}})
    facts = host(modules={"nvidia": "Live", "nvidia_peermem": "Loading"})
    results = by_subject(MODULES.run(node(facts), prof))
    assert results["nvidia"].status is Status.PASS
    assert results["nvidia_peermem"].observed == "loading" and results["nvidia_peermem"].status is Status.FAIL
    missing = by_subject(MODULES.run(node(host(modules={})), prof))
    assert missing["nvidia"].observed == "absent" and missing["nvidia"].severity is Severity.CRITICAL
    unknown = MODULES.run(node(host(modules=Unknown("no /proc/modules"))), prof)
    assert {f.status for f in unknown} == {Status.UNKNOWN}


def test_gpu_pci_count_names_the_gpus() -> None:
    prof = profile({"gpu_pci": {"count": exp("critical", equals=8)}})
    (finding,) = PCI_COUNT.run(node(), prof)
    assert finding.status is Status.FAIL and finding.observed == 2
    assert "0000:19:00.0, 0000:9b:00.0" in finding.message
    assert finding.action == "contact_support"


def test_profile_match_fallback_warns_and_names_the_hardware() -> None:
    match = ProfileMatch("generic-nvidia", "fallback", "8 NVIDIA GPU(s) [10de:2342] in Acme Box")
    (finding,) = PROFILE_MATCH.run(node(profile_match=match), profile({}))
    assert finding.status is Status.WARN and "10de:2342" in finding.message
    auto = ProfileMatch("hgx-h100-sxm", "auto", "x", matched_on=("gpu_pci_ids=10de:2330",))
    (ok,) = PROFILE_MATCH.run(node(profile_match=auto), profile({}))
    assert ok.status is Status.PASS and "gpu_pci_ids=10de:2330" in ok.message
    tie = auto._replace(also_matched=("twin",))
    (warn,) = PROFILE_MATCH.run(node(profile_match=tie), profile({}))
    assert warn.status is Status.WARN and "twin" in warn.message


def test_source_available_statuses() -> None:
    sources = {
        "host": SourceStatus("host", ok=True, duration_s=0.01),
        "nvml": SourceStatus("nvml", ok=False, error="NVMLError_LibraryNotFound: NVML Shared Library Not Found"),
        "redfish": SourceStatus("redfish", ok=False, configured=False, error="not configured (--bmc)"),
    }
    results = by_subject(SOURCE.run(node(sources=sources), profile({})))
    assert results["host"].status is Status.PASS
    assert results["nvml"].status is Status.FAIL and results["nvml"].source == "nvml"  # GPUs are on PCI
    assert "NVML Shared Library Not Found" in results["nvml"].message
    assert results["redfish"].status is Status.SKIP
    no_gpus = node(host(pci=()), sources=sources)
    assert by_subject(SOURCE.run(no_gpus, profile({})))["nvml"].status is Status.WARN


def test_each_check_names_its_fact_areas_itself() -> None:
    """Issue 32.4: no table keyed by check id beside the registry (the old FACT_AREAS): a check's `parts`
    say what it reads, or its source does; every name is one an imported snapshot knows."""
    import checks
    from agent.sources.host_parts import HOST_PARTS

    assert not hasattr(checks, "FACT_AREAS")
    known = {*HOST_PARTS, "host", "nvml", "kmsg", "redfish", "ipmi", "subject",
             *(f"ipmi.{part}" for part in ("sensors", "sel", "fru", "device_id", "power"))}
    unknown = {c.id: sorted(set(c.fact_areas) - known) for c in all_checks() if set(c.fact_areas) - known}
    assert unknown == {}
    assert next(c for c in all_checks() if c.id == "host.sysctl").fact_areas == ("sysctl",)  # moved, not lost


def test_an_evaluator_does_not_repeat_the_path_its_check_declared() -> None:
    """Issue 32.4: `CHECK.expectation(profile)` reads the path the check declared (`expect_path`) once; an
    evaluator that spells its own check's path again (`profile.expectation("thp", "enabled")`) is found
    here. Reading another check's expectation (gpu.driver reads host.driver.version's) is not a repeat."""
    import ast
    import importlib

    from checks import Check
    from tests.conftest import REPO

    repeated = []
    for path in sorted((REPO / "checks").glob("*.py")):
        module = importlib.import_module(f"checks.{path.stem}") if path.stem != "__init__" else None
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            owners = [getattr(module, d.value.id, None) for d in fn.decorator_list if isinstance(d, ast.Attribute)
                      and d.attr in ("evaluator", "series_evaluator") and isinstance(d.value, ast.Name)]
            own = {o.expect_path for o in owners if isinstance(o, Check) and o.expect_path}
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if (isinstance(call.func, ast.Attribute) and call.func.attr == "expectation"
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "profile"
                        and all(isinstance(a, ast.Constant) for a in call.args)
                        and tuple(a.value for a in call.args) in own):  # type: ignore[attr-defined]
                    repeated.append(f"{path.name}:{call.lineno}")
    assert repeated == []
