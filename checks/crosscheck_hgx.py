"""crosscheck.hgx_gpu_health: the HGX baseboard's view of each GPU against the host system's (rule 9).

On HGX and GB200 systems the BMC lists each GPU twice: under the host ComputerSystem
(`Systems/1/Processors/GPU1`, what the platform BMC knows) and under the baseboard's own system
(`Systems/HGX_Baseboard_0/Processors/GPU_SXM_1`, what the HGX management controller reads from the
GPU itself). A GPU that one view reports `InTest`, `Warning` or `Critical` while the other says OK
is a discrepancy: one of the two BMCs is stale or blind, and jobs should not land on that GPU
until someone knows which. Both views are the BMC's, so this runs in a BMC-only audit too.

The views are paired by serial number, then UUID, then by position (slot or instance number
order) when the rest are as many on each side; a GPU that cannot be paired is not guessed at. A GPU
the baseboard reports InTest, Warning or Critical is a finding even when only that view lists it (or
the host view gives it no health): the baseboard reads the GPU itself, so its word is positive
evidence; there is just no second view to hold it against.
"""

from __future__ import annotations

import re

from agent.core.expect import Expectation
from agent.core.facts import BmcFacts, BmcGpu, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check

HGX_HEALTH = Check("crosscheck.hgx_gpu_health", "GPU health: HGX baseboard vs host system (BMC)", source="bmc",
                   action="check_bmc_events",
                   evidence=("the HGX baseboard's and the host system's view of the same GPU (paired by serial, UUID,"
                             " then position) disagreeing on InTest/Warning/Critical"), parts=("redfish",))

BAD_HEALTH = ("Warning", "Critical")
NOT_JUDGING = ("Absent", "Disabled", "UnavailableOffline", "StandbyOffline")  # the view does not see the GPU
PLACEHOLDERS = {"", "na", "n/a", "none", "null", "unknown", "not available", "0", "uuid-here"}
_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def verdict(gpu: BmcGpu) -> str | None:
    """'bad' (InTest, Warning, Critical), 'ok' (Health OK), None: this view does not judge the GPU."""
    if gpu.state == "InTest" or gpu.health in BAD_HEALTH:
        return "bad"
    if gpu.health == "OK" and gpu.state not in NOT_JUDGING:
        return "ok"
    return None


def gpu_id(gpu: BmcGpu) -> str:
    """The resource's own id (GPU_SXM_1); NVIDIA names every Processor just "Processor"."""
    return gpu.where.rstrip("/").rsplit("/", 1)[-1] or gpu.name


def _position(gpu: BmcGpu) -> tuple[int, str]:
    for text in (gpu.slot, gpu_id(gpu), gpu.name):
        match = _NUMBER.search(text or "")
        if match:
            return int(match.group(1)), gpu_id(gpu)
    return 0, gpu_id(gpu)


def _key(gpu: BmcGpu, field: str) -> str | None:
    value = getattr(gpu, field)
    return value.strip().lower() if isinstance(value, str) and value.strip().lower() not in PLACEHOLDERS else None


def pair_views(host: list[BmcGpu], board: list[BmcGpu]) -> tuple[list[tuple[BmcGpu, BmcGpu, str]], int, int]:
    """(host GPU, baseboard GPU, how) pairs, and how many of each side stayed unpaired."""
    pairs: list[tuple[BmcGpu, BmcGpu, str]] = []
    left_host, left_board = list(host), list(board)
    for field in ("serial", "uuid"):
        for gpu in list(left_host):
            key = _key(gpu, field)
            same_host = [g for g in left_host if key is not None and _key(g, field) == key]
            same_board = [g for g in left_board if key is not None and _key(g, field) == key]
            if len(same_host) == 1 and len(same_board) == 1:
                pairs.append((gpu, same_board[0], field))
                left_host.remove(gpu)
                left_board.remove(same_board[0])
    if left_host and len(left_host) == len(left_board):
        for gpu, other in zip(sorted(left_host, key=_position), sorted(left_board, key=_position), strict=True):
            pairs.append((gpu, other, "position"))
        left_host, left_board = [], []
    return pairs, len(left_host), len(left_board)


def _describe(gpu: BmcGpu) -> str:
    return f"{gpu.health or 'no health'}/{gpu.state or 'no state'}"


def _judge(host: BmcGpu, board: BmcGpu, how: str, expectation: Expectation) -> Finding:
    subject = gpu_id(board)
    where = f" (slot {board.slot})" if board.slot else ""
    observed = {"baseboard": _describe(board), "host": _describe(host), "paired_by": how}
    views = {"the HGX baseboard": board, f"the host system ({host.system or '?'})": host}
    seen = {name: verdict(gpu) for name, gpu in views.items()}
    text = "; ".join(f"{name} says {_describe(gpu)} ({gpu.where})" for name, gpu in views.items())
    paired = "" if how != "position" else " (paired by position: neither view gives a usable serial or UUID)"

    def emit(status: Status, severity: Severity, message: str, action: str | None = None) -> Finding:
        return HGX_HEALTH.finding(subject, status, severity, message, observed=observed, expected="both views agree",
                                  reason=expectation.reason, action=action)

    if seen["the HGX baseboard"] == "bad" and None in seen.values():
        return alone(board, expectation, f"the host system gives it no health ({_describe(host)}, {host.where})")
    if None in seen.values():
        blind = next(name for name, v in seen.items() if v is None)
        return emit(Status.SKIP, Severity.INFO,
                    f"GPU {subject}{where}: not compared, {blind} reports no health for it: {text}{paired}")
    if len(set(seen.values())) == 1:
        agree = "OK" if "ok" in seen.values() else "not OK (bmc.health_rollup names the fault)"
        return emit(Status.PASS, Severity.INFO, f"GPU {subject}{where}: both views agree, {agree}{paired}")
    bad_name, bad = next((name, gpu) for name, gpu in views.items() if seen[name] == "bad")
    ok_name = next(name for name in views if name != bad_name)
    message = f"GPU {subject}{where}: {bad_name} reports {_describe(bad)} while {ok_name} says OK: {text}{paired}"
    if bad.health == "Critical":
        return emit(Status.FAIL, Severity.CRITICAL, message + "; keep jobs off this GPU until the fault is understood",
                    action="drain")
    if bad.health != "Warning":  # InTest, health OK or not given: a test is running in one view
        return emit(Status.WARN, expectation.severity,
                    message + "; wait for the in-system test to end, then compare again")
    return emit(expectation.status_on_mismatch(), expectation.severity, message)


def alone(board: BmcGpu, expectation: Expectation, why: str) -> Finding:
    """A GPU the baseboard alone judges bad (InTest, Warning, Critical): a finding with no second view."""
    subject = gpu_id(board)
    where = f" (slot {board.slot})" if board.slot else ""
    message = f"GPU {subject}{where}: the HGX baseboard reports {_describe(board)} ({board.where}); {why}"
    observed = {"baseboard": _describe(board), "host": None}
    if board.health == "Critical":
        return HGX_HEALTH.finding(subject, Status.FAIL, Severity.CRITICAL,
                                  message + "; keep jobs off this GPU until the fault is understood",
                                  observed=observed, expected="both views agree", reason=expectation.reason,
                                  action="drain")
    if board.health != "Warning":  # InTest
        return HGX_HEALTH.finding(subject, Status.WARN, expectation.severity,
                                  message + "; wait for the in-system test to end, then look again",
                                  observed=observed, expected="both views agree", reason=expectation.reason)
    return HGX_HEALTH.finding(subject, expectation.status_on_mismatch(), expectation.severity, message,
                              observed=observed, expected="both views agree", reason=expectation.reason)


@HGX_HEALTH.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("crosscheck", "hgx_gpu_health")
    bmc = facts.bmc
    if expectation is None or not isinstance(bmc, BmcFacts):
        return []
    views = bmc.gpu_views if not isinstance(bmc.gpu_views, Unknown) else bmc.gpus
    if isinstance(views, Unknown) or not views:
        return []  # no GPU Processors: bmc.reachable says why, or there are none
    board = [g for g in views if g.baseboard]
    host = [g for g in views if not g.baseboard]
    if not board or not host:
        only = "the HGX baseboard" if board else "the host system"
        findings = [HGX_HEALTH.finding("node", Status.SKIP, Severity.INFO,
                                       f"only {only} lists GPU processors ({len(board or host)}): no second view "
                                       "to compare with", expected="both views agree")]
        findings += [alone(g, expectation, "the host system lists no GPU processors to compare with")
                     for g in sorted(board, key=_position) if verdict(g) == "bad"]
    else:
        pairs, host_left, board_left = pair_views(host, board)
        findings = sorted((_judge(h, b, how, expectation) for h, b, how in pairs), key=lambda f: _natural(f.subject))
        paired = {id(b) for _, b, _ in pairs}
        findings += [alone(g, expectation, "the host system's view of it could not be paired")
                     for g in sorted(board, key=_position) if id(g) not in paired and verdict(g) == "bad"]
        if host_left or board_left:
            findings.append(HGX_HEALTH.finding(
                "node", Status.SKIP, Severity.INFO,
                f"{host_left} host-system and {board_left} baseboard GPU(s) could not be paired (no shared serial "
                "or UUID, and not as many on each side): not compared",
                observed={"host": len(host), "baseboard": len(board)}, expected="both views agree"))
    for finding in findings:
        finding.source = bmc.protocol  # the report names the protocol the BMC answered on
    for finding in findings:
        finding.source = "redfish"  # both views are the BMC's Redfish (the report's source contract)
    return findings


def _natural(subject: str) -> tuple[int, str]:
    match = _NUMBER.search(subject)
    return (int(match.group(1)) if match else -1, subject)
