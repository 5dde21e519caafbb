"""GPU memory health: ECC mode and counters, retired pages, row remapping."""

from __future__ import annotations

from collections.abc import Callable

from agent.core.expect import counter_total, saturated
from agent.core.facts import GpuFacts, NodeFacts, NvmlFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import (
    ECC_BITS,
    REMAP_BITS,
    RETIRED_BITS,
    gpu_refs,
    not_reported_under_mig,
    nvml_gpus,
    per_gpu,
    subject,
)

ECC_MODE = Check("gpu.ecc.mode", "ECC mode", source="nvml", remediation="gpu_ecc", action="reboot",
                 evidence="NVML current and pending ECC mode; a pending change is reported as such")
UNCORRECTED = Check("gpu.ecc.uncorrected", "Uncorrected ECC errors since reset", source="nvml",
                    action="reset_gpu",
                    evidence="NVML volatile uncorrected ECC counters since the last reset")
CORRECTED = Check("gpu.ecc.corrected", "Corrected ECC errors (lifetime)", source="nvml", action="contact_support",
                  evidence=("NVML lifetime corrected ECC counters against the profile's limit; a saturated counter "
                            "counts as at least its maximum"))
RETIRED = Check("gpu.retired_pages", "Retired memory pages (pre-Ampere)", source="nvml", action="reset_gpu",
                evidence="NVML retired pages (pre-Ampere) and pending retirement; unsupported is skip")
ROW_REMAP = Check("gpu.row_remap", "Row remapping (Ampere and later)", source="nvml", action="reset_gpu",
                  evidence=("NVML remapped rows and remapping failure/pending flags (Ampere and later); unsupported "
                            "is skip"))


@ECC_MODE.evaluator
def evaluate_mode(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "ecc", "mode")
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(ECC_MODE, facts, expectation)
    for gpu in gpus:
        finding = ECC_MODE.compare(subject(gpu), expectation, gpu.ecc_mode, f"{gpu.label} ECC")
        pending = gpu.ecc_pending
        if isinstance(pending, str) and pending != gpu.ecc_mode:
            if finding.status is Status.FAIL and expectation.evaluate(pending).ok:
                # Already fixed, waiting for the reboot that applies it.
                finding.status = Status.WARN
                finding.message += f"; {pending} is pending: reboot to apply"
                finding.action = "reboot"
            elif finding.status is Status.PASS and not expectation.evaluate(pending).ok:
                finding.status = Status.WARN
                finding.message += f"; but {pending} is pending and takes effect at the next reboot"
                finding.action = "review_pending_change"
        findings.append(finding)
    return findings


def _mig_aware(check: Check, facts: NodeFacts, findings: list[Finding], observe: Callable[[GpuFacts], object],
               what: str) -> list[Finding]:
    """Counters N/A because MIG is enabled say so (issue 22 item 3)."""
    gpus = {subject(g): g for g in facts.nvml.gpus} if isinstance(facts.nvml, NvmlFacts) else {}
    return [not_reported_under_mig(check, f, gpus[f.subject], observe(gpus[f.subject]), what)
            if f.subject in gpus else f for f in findings]


@UNCORRECTED.evaluator
def evaluate_uncorrected(facts: NodeFacts, profile: Profile) -> list[Finding]:
    def observe(g: GpuFacts) -> object:
        return g.ecc_volatile_uncorrected

    what = "volatile uncorrected ECC errors"
    return _mig_aware(UNCORRECTED, facts, per_gpu(UNCORRECTED, facts, profile.expectation("gpu", "ecc", "uncorrected"),
                                                  observe, what, bits=ECC_BITS), observe, what)


@CORRECTED.evaluator
def evaluate_corrected(facts: NodeFacts, profile: Profile) -> list[Finding]:
    def observe(g: GpuFacts) -> object:
        return g.ecc_aggregate_corrected

    what = "aggregate corrected ECC errors"
    return _mig_aware(CORRECTED, facts, per_gpu(CORRECTED, facts, profile.expectation("gpu", "ecc", "corrected"),
                                                observe, what, bits=ECC_BITS), observe, what)


def _retired_total(gpu: GpuFacts) -> object:
    """SBE + DBE retired pages; at least that when either counter is at its maximum."""
    return counter_total([saturated(gpu.retired_sbe, RETIRED_BITS, "retired SBE pages"),
                          saturated(gpu.retired_dbe, RETIRED_BITS, "retired DBE pages")])


@RETIRED.evaluator
def evaluate_retired(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "retired_pages")
    findings = per_gpu(RETIRED, facts, expectation, _retired_total, "retired pages")
    gpus = {subject(g): g for g in nvml_gpus(RETIRED, facts, expectation)[0]}
    for finding in findings:
        gpu = gpus.get(finding.subject)
        pending = gpu is not None and gpu.retired_pending is True
        if finding.status is Status.FAIL:
            # Over the limit the board qualifies for replacement: a reset only applies a pending retirement.
            finding.action = "contact_support"
            finding.message += ": the board qualifies for replacement (RMA)" + (
                "; a page retirement is also pending: reset the GPU to apply it" if pending else "")
        elif pending and finding.status is Status.PASS:
            finding.status = Status.WARN
            finding.message += "; a page retirement is pending: reset the GPU (or reboot) to apply it"
            finding.action = "reset_gpu"
    return findings


@ROW_REMAP.evaluator
def evaluate_row_remap(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "row_remap", "uncorrectable")
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(ROW_REMAP, facts, expectation)
    for gpu in gpus:
        name = subject(gpu)
        if gpu.remap_failure is True:
            findings.append(ROW_REMAP.finding(
                name, Status.FAIL, Severity.CRITICAL,
                f"{gpu.label} row remapping FAILED: a bank has no spare rows left",
                observed={"failure": True}, expected={"failure": False},
                reason="A remapping failure leaves bad memory in use; the GPU needs replacement",
                action="contact_support"))
            continue
        finding = not_reported_under_mig(ROW_REMAP, ROW_REMAP.compare(
            name, expectation, gpu.remapped_uncorrectable, f"{gpu.label} rows remapped for uncorrectable errors",
            refs=gpu_refs(gpu), bits=REMAP_BITS), gpu, gpu.remapped_uncorrectable, "row remapping")
        if finding.status is Status.FAIL:  # more remapped rows than the limit: degrading HBM, not a reset
            finding.action = "contact_support"
        if gpu.remap_pending is True and finding.status in (Status.PASS, Status.SKIP):
            finding.status = Status.WARN
            finding.message += "; a row remap is pending: reset the GPU to activate it"
            finding.action = "reset_gpu"
            finding.observed = {"uncorrectable": gpu.remapped_uncorrectable, "pending": True}
        findings.append(finding)
    return findings
