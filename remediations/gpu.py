"""GPU actuators through NVML setters: persistence mode, power limit (`safe`), compute mode and
application clocks (`disruptive`), ECC (`reboot`).

The GPU is read with the audit's own NVML reader, so the values a relative
expectation refers to ("@default_limit_w") are the ones the check used. A
power limit outside the device's NVML constraints is refused at plan time.
"""

from __future__ import annotations

import re
from typing import Any

from agent.core.expect import Expectation
from agent.core.facts import GpuFacts
from agent.core.model import Finding, Unknown
from agent.sources.nvml import COMPUTE_MODES, read_nvml
from agent.sources.nvml_const import NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM  # not pynvml: importing this loads no binding
from checks.gpu_clocks import describe_app_clocks
from remediations import Action, ActionClass, NvmlSet, PlanContext, actuator, refused, target_value

_GPU_RE = re.compile(r"^gpu(\d{1,3})$")


def _enabled(value: Any) -> str:
    return "enabled" if int(value) == 1 else "disabled"


def _compute_mode(value: Any) -> str:
    return COMPUTE_MODES.get(int(value), f"mode {value}")


def _watts(value: Any) -> str:
    watts = int(value) / 1000
    return f"{watts:g}"


def _gpu(finding: Finding, ctx: PlanContext, action_id: str,
         action_class: ActionClass = ActionClass.SAFE) -> GpuFacts | Action:
    """The finding's GPU as the audit reads it, or a refused action (of the actuator's class) saying why not."""
    found = _read_gpu(finding, ctx, action_id)
    if isinstance(found, Action):
        found.action_class = action_class
    return found


def _read_gpu(finding: Finding, ctx: PlanContext, action_id: str) -> GpuFacts | Action:
    match = _GPU_RE.match(finding.subject)
    if match is None:
        return refused(action_id, finding, ActionClass.SAFE, finding.observed, f"not a GPU subject: {finding.subject}")
    if "nvml" not in ctx.cache:
        nvml = ctx.target.nvml()
        ctx.cache["nvml"] = Unknown("NVML is not available") if nvml is None else read_nvml(nvml, initialized=True)[0]
    facts = ctx.cache["nvml"]
    if isinstance(facts, Unknown):
        return refused(action_id, finding, ActionClass.SAFE, finding.observed, f"cannot read NVML: {facts.reason}")
    index = int(match.group(1))
    gpu: GpuFacts | None = next((g for g in facts.gpus if g.index == index), None)
    if gpu is None or gpu.lost is not None:
        return refused(action_id, finding, ActionClass.SAFE, finding.observed, f"GPU {index} is not readable")
    return gpu


@actuator("gpu_persistence", writes=("nvml:gpu*:nvmlDeviceSetPersistenceMode",))
def plan_persistence(finding: Finding, ctx: PlanContext) -> list[Action]:
    action_id = f"gpu_persistence:{finding.subject}"
    expectation = ctx.profile.expectation("gpu", "persistence_mode")
    gpu = _gpu(finding, ctx, action_id)
    if isinstance(gpu, Action):
        return [gpu]
    value = target_value(expectation) if expectation else None
    if expectation is None or value not in ("enabled", "disabled"):
        return [refused(action_id, finding, ActionClass.SAFE, gpu.persistence_mode,
                        "the profile names no persistence mode to set")]
    if expectation.evaluate(gpu.persistence_mode).ok:
        return []
    return [Action(action_id, "gpu_persistence", ActionClass.SAFE, finding.subject, finding.check,
                   gpu.persistence_mode, value, expectation=expectation,
                   changes=(NvmlSet(gpu.index, "nvmlDeviceGetPersistenceMode", "nvmlDeviceSetPersistenceMode",
                                    1 if value == "enabled" else 0, _enabled),))]


@actuator("gpu_power_limit", writes=("nvml:gpu*:nvmlDeviceSetPowerManagementLimit",))
def plan_power_limit(finding: Finding, ctx: PlanContext) -> list[Action]:
    action_id = f"gpu_power_limit:{finding.subject}"
    profile_expectation = ctx.profile.expectation("gpu", "power", "limit")
    gpu = _gpu(finding, ctx, action_id)
    if isinstance(gpu, Action):
        return [gpu]
    if profile_expectation is None:
        return [refused(action_id, finding, ActionClass.SAFE, gpu.power_limit_w, "not in the profile")]
    expectation = profile_expectation.resolve(gpu._asdict())
    if not isinstance(expectation, Expectation):
        return [refused(action_id, finding, ActionClass.SAFE, gpu.power_limit_w, expectation)]
    value = target_value(expectation)
    if value is None:
        return [refused(action_id, finding, ActionClass.SAFE, gpu.power_limit_w,
                        f"the profile allows {expectation.describe()} but names no single limit to set")]
    if expectation.evaluate(gpu.power_limit_w).ok:
        return []
    milliwatts = round(float(value) * 1000)
    nvml = ctx.target.nvml()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    except Exception as exc:  # noqa: BLE001 - NVMLError or deadline: refuse with the reason
        return [refused(action_id, finding, ActionClass.SAFE, gpu.power_limit_w,
                        f"cannot read the power limit constraints: {exc}")]
    if not int(low) <= milliwatts <= int(high):
        return [refused(action_id, finding, ActionClass.SAFE, gpu.power_limit_w,
                        f"{float(value):g} W is outside GPU {gpu.index}'s limits "
                        f"[{int(low) / 1000:g}, {int(high) / 1000:g}] W")]
    return [Action(action_id, "gpu_power_limit", ActionClass.SAFE, finding.subject, finding.check,
                   gpu.power_limit_w, float(value), expectation=expectation,
                   changes=(NvmlSet(gpu.index, "nvmlDeviceGetPowerManagementLimit",
                                    "nvmlDeviceSetPowerManagementLimit", milliwatts, _watts),))]


def gpu_processes(ctx: PlanContext, index: int) -> list[int] | str:
    """PIDs of compute and graphics processes on a GPU, or why they cannot be listed."""
    nvml = ctx.target.nvml()
    pids: list[int] = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            pids.extend(int(getattr(p, "pid", 0) if not isinstance(p, dict) else p.get("pid", 0))
                        for p in getattr(nvml, getter)(handle))
    except Exception as exc:  # noqa: BLE001 - unknown means "maybe busy": refuse
        return f"cannot list the processes on GPU {index}: {exc}"
    return sorted(set(pids))


def refuse_while_busy(ctx: PlanContext, index: int, action_id: str, finding: Finding, before: Any) -> Action | None:
    """A disruptive change waits for an idle GPU: refused while processes run, or when that is unknown."""
    busy = gpu_processes(ctx, index)
    if not isinstance(busy, str) and not busy:
        return None
    why = busy if isinstance(busy, str) else f"processes {', '.join(map(str, busy))} are running on it"
    return refused(action_id, finding, ActionClass.DISRUPTIVE, before, f"{why}; drain the GPU first")


@actuator("gpu_compute_mode", writes=("nvml:gpu*:nvmlDeviceSetComputeMode",))
def plan_compute_mode(finding: Finding, ctx: PlanContext) -> list[Action]:
    """Compute mode is `disruptive`: running jobs may lose access, so it is refused while any run."""
    action_id = f"gpu_compute_mode:{finding.subject}"
    expectation = ctx.profile.expectation("gpu", "compute_mode")
    gpu = _gpu(finding, ctx, action_id, ActionClass.DISRUPTIVE)
    if isinstance(gpu, Action):
        return [gpu]
    value = target_value(expectation) if expectation else None
    mode = next((m for m, name in COMPUTE_MODES.items() if name == value), None)
    if expectation is None or mode is None:
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, gpu.compute_mode,
                        f"the profile names no NVML compute mode ({', '.join(COMPUTE_MODES.values())})")]
    if expectation.evaluate(gpu.compute_mode).ok:
        return []
    busy = refuse_while_busy(ctx, gpu.index, action_id, finding, gpu.compute_mode)
    if busy is not None:
        return [busy]
    return [Action(action_id, "gpu_compute_mode", ActionClass.DISRUPTIVE, finding.subject, finding.check,
                   gpu.compute_mode, value, expectation=expectation,
                   changes=(NvmlSet(gpu.index, "nvmlDeviceGetComputeMode", "nvmlDeviceSetComputeMode", mode,
                                    _compute_mode),))]


def _pending_ecc(value: Any) -> str:
    return _enabled(value[1])  # nvmlDeviceGetEccMode -> (current, pending)


@actuator("gpu_ecc", writes=("nvml:gpu*:nvmlDeviceSetEccMode",))
def plan_ecc(finding: Finding, ctx: PlanContext) -> list[Action]:
    """ECC is `reboot` class: NVML stages the mode; it takes effect at the next GPU reset or reboot."""
    action_id = f"gpu_ecc:{finding.subject}"
    expectation = ctx.profile.expectation("gpu", "ecc", "mode")
    gpu = _gpu(finding, ctx, action_id, ActionClass.REBOOT)
    if isinstance(gpu, Action):
        return [gpu]
    value = target_value(expectation) if expectation else None
    if expectation is None or value not in ("enabled", "disabled"):
        return [refused(action_id, finding, ActionClass.REBOOT, gpu.ecc_mode, "the profile names no ECC mode")]
    if expectation.evaluate(gpu.ecc_mode).ok or gpu.ecc_pending == value:
        return []  # already right, or already staged: the audit reports "reboot to apply"
    return [Action(action_id, "gpu_ecc", ActionClass.REBOOT, finding.subject, finding.check,
                   gpu.ecc_mode, value, expectation=expectation,
                   notes=["staged: takes effect after a GPU reset or reboot"],
                   changes=(NvmlSet(gpu.index, "nvmlDeviceGetEccMode", "nvmlDeviceSetEccMode",
                                    1 if value == "enabled" else 0, _pending_ecc,
                                    undo=lambda before: [before[1]]),))]  # restore the staged mode


@actuator("gpu_app_clocks", writes=("nvml:gpu*:nvmlDeviceSetApplicationsClocks",))
def plan_app_clocks(finding: Finding, ctx: PlanContext) -> list[Action]:
    """Application clocks back to the board's defaults: `disruptive` (running jobs' clocks change)."""
    action_id = f"gpu_app_clocks:{finding.subject}"
    expectation = ctx.profile.expectation("gpu", "applications_clocks")
    gpu = _gpu(finding, ctx, action_id, ActionClass.DISRUPTIVE)
    if isinstance(gpu, Action):
        return [gpu]
    observed = describe_app_clocks(gpu)
    if expectation is None or target_value(expectation) != "default":
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, observed,
                        "the profile asks for no application clocks to reset to (only `default` is supported)")]
    defaults = gpu.default_app_clocks_mhz
    if isinstance(defaults, Unknown) or isinstance(observed, Unknown):
        why = defaults.reason if isinstance(defaults, Unknown) else getattr(observed, "reason", "")
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, observed,
                        f"cannot read the application clocks: {why}")]
    if expectation.evaluate(observed).ok:
        return []
    busy = refuse_while_busy(ctx, gpu.index, action_id, finding, observed)
    if busy is not None:
        return [busy]
    graphics, memory = defaults

    def parse(read: Any) -> str:  # [memory, graphics] as read below
        return "default" if (int(read[1]), int(read[0])) == (graphics, memory) else (
            f"graphics {read[1]} MHz, memory {read[0]} MHz")

    # Set the defaults explicitly (what nvmlDeviceResetApplicationsClocks does) so that the
    # same setter, with the journaled pair, restores the prior clocks.
    return [Action(action_id, "gpu_app_clocks", ActionClass.DISRUPTIVE, finding.subject, finding.check,
                   observed, "default", expectation=expectation,
                   changes=(NvmlSet(gpu.index, "nvmlDeviceGetApplicationsClock", "nvmlDeviceSetApplicationsClocks",
                                    (memory, graphics), parse, reads=((NVML_CLOCK_MEM,), (NVML_CLOCK_GRAPHICS,)),
                                    undo=list),))]
