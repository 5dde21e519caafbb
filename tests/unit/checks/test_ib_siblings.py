"""ib.port.state without a rail expectation: a port down beside its running siblings (issue 13, oracle)."""

from __future__ import annotations

import dataclasses

from agent.core.facts import NodeFacts, RdmaDevice, RdmaPort
from agent.core.model import Status, Unsupported
from agent.policy.profiles import ProfileStore
from agent.sources.host import absent_host_facts
from checks.ib import PORT_STATE


def facts_with(*devices: RdmaDevice) -> NodeFacts:
    host = dataclasses.replace(absent_host_facts("not in this test"), rdma=devices)
    return NodeFacts(host=host, kmsg=Unsupported("not in this test"))


def hca(name: str, state: str = "ACTIVE", phys: str = "LinkUp", hca_type: str = "MT4129",
        physfn: str | None = None) -> RdmaDevice:
    return RdmaDevice(name, hca_type=hca_type, ports=(RdmaPort(1, state=state, phys_state=phys),), physfn=physfn)


def judged(facts: NodeFacts) -> dict[str, Status]:
    return {f.subject: f.status for f in PORT_STATE.run(facts, ProfileStore().profile("generic-nvidia"))}


def test_a_port_down_beside_active_siblings_of_its_type_warns() -> None:
    facts = facts_with(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2", "DOWN", "Disabled"), hca("mlx5_3", hca_type="MT4125"))
    found = PORT_STATE.run(facts, ProfileStore().profile("generic-nvidia"))
    assert [(f.subject, f.status, f.severity.value, f.action) for f in found] == [
        ("mlx5_2/1", Status.WARN, "warning", "check_link")]
    assert "2 of its 3 MT4129 ports are ACTIVE/LinkUp" in found[0].message


def test_no_siblings_to_compare_with_says_nothing() -> None:
    # One active sibling is not a pattern; a frontend NIC of another type down is not a rail down;
    # a container's SR-IOV VF is never a rail.
    assert judged(facts_with(hca("mlx5_0"), hca("mlx5_1", "DOWN", "Disabled"))) == {}
    assert judged(facts_with(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2", "DOWN", "Disabled", "MT4125"))) == {}
    assert judged(facts_with(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2", "DOWN", "Disabled", physfn="0000:01:00.0"))) == {}
    assert judged(facts_with(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2"))) == {}  # all up: passes are not listed
