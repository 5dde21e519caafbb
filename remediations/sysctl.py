"""sysctl: runtime write to /proc/sys plus persistence in /etc/sysctl.d/90-nodewarden.conf.

Only keys the profile names are touched; other files in sysctl.d are never
edited. A file that sysctl --system / systemd-sysctl applies after ours and
sets the same key would undo the value at boot: the action says so.
"""

from __future__ import annotations

import fnmatch
import re

from agent.core.model import Finding
from agent.sources.host import InvalidName, normalize_sysctl, sysctl_path
from remediations import (
    Action,
    ActionClass,
    AttrWrite,
    FileEdit,
    PlanContext,
    actuator,
    guard_config_text,
    refused,
    target_value,
    unsafe_for_config,
)

CONF_NAME = "90-nodewarden.conf"
CONF_PATH = f"/etc/sysctl.d/{CONF_NAME}"
# systemd-sysctl's search path, first wins for equal names; procps also reads /etc/sysctl.conf last.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
HEADER = b"# Managed by nodewarden remediate: keys from the node's tuning profile.\n"

# Checks whose subject is not the key itself.
_KEY_OF_CHECK = {"host.numa.balancing": ("kernel.numa_balancing", ("numa", "balancing"))}
_LINE_RE = re.compile(r"^\s*-?\s*([A-Za-z0-9_./-]+)\s*=\s*(.*?)\s*$")

# Sysctls that decide who may run what as root or read kernel memory: a profile file may ask for
# them (they are still judged) but remediate never writes them unless the operator's own profile
# names them in `remediate_protected_sysctls:` (agent.policy.profiles). `kernel.core_pattern = |/tmp/x`
# alone makes root run a program of the writer's choosing. Matched on the canonical /proc/sys path.
PROTECTED_SYSCTLS = (
    "kernel.core_pattern", "kernel.core_pipe_limit", "kernel.modprobe", "kernel.hotplug",
    "kernel.poweroff_cmd", "kernel.usermodehelper.*", "kernel.modules_disabled", "kernel.kexec_load_disabled",
    "kernel.kptr_restrict", "kernel.dmesg_restrict", "kernel.perf_event_paranoid", "kernel.yama.*",
    "kernel.unprivileged_bpf_disabled", "kernel.unprivileged_userns_clone", "kernel.randomize_va_space",
    "kernel.sysrq", "kernel.io_uring_disabled", "kernel.ftrace_enabled", "kernel.seccomp.*",
    "fs.suid_dumpable", "fs.protected_*", "fs.binfmt_misc.*", "vm.mmap_min_addr", "vm.unprivileged_userfaultfd",
    "net.core.bpf_jit_*", "user.*", "dev.tty.ldisc_autoload", "dev.tty.legacy_tiocsti", "debug.*",
)


def protected_sysctl(path: str) -> str | None:
    """The deny-list entry covering the /proc/sys `path` (None: a profile may set it)."""
    name = path.removeprefix("/proc/sys/").replace("/", ".")
    return next((p for p in PROTECTED_SYSCTLS if fnmatch.fnmatchcase(name, p)), None)


def parse_sysctl_value(raw: bytes) -> str:
    # A value that is not UTF-8 (a hostile or broken recording) is compared and shown escaped
    # (`\xff`), never a crash; it then differs from any value a profile names.
    return normalize_sysctl(raw.decode("utf-8", "backslashreplace"))


def shown_sysctl(old: bytes, value: str) -> bytes:
    # The kernel prints multi-value sysctls tab-separated, one line.
    sep = "\t" if b"\t" in old else " "
    return (sep.join(value.split()) + "\n").encode()


def _conf_key(key: str) -> str:
    return key.replace("/", ".")


def set_conf_key(old: bytes | None, key: str, value: str, header: bytes = HEADER) -> bytes:
    """Set `key = value` in one of our conf files, keeping every other line as it was."""
    guard_config_text(key, value)  # sysctl.d and boot.conf: never a second line from a value
    # surrogateescape: another line's foreign bytes are kept exactly as they were
    lines = (old or header).decode("utf-8", "surrogateescape").splitlines()
    out, found = [], False
    for line in lines:
        match = _LINE_RE.match(line)
        if match and _conf_key(match.group(1)) == _conf_key(key):
            if not found:
                out.append(f"{key} = {value}")
            found = True
            continue
        out.append(line)
    if not found:
        out.append(f"{key} = {value}")
    return ("\n".join(out) + "\n").encode("utf-8", "surrogateescape")


def conf_settings(text: str, sysctl_keys: bool = True) -> dict[str, str]:
    """`key = value` lines; sysctl keys spell dots as '/' too (normalized unless told otherwise)."""
    settings = {}
    for line in text.splitlines():
        if line.lstrip().startswith(("#", ";")):
            continue
        match = _LINE_RE.match(line)
        if match:
            key = match.group(1)
            settings[_conf_key(key) if sysctl_keys else key] = match.group(2)
    return settings


def later_overrides(ctx: PlanContext, key: str) -> list[str]:
    """Files applied after ours at boot that set `key` (name: what they set)."""
    chosen: dict[str, str] = {}
    for directory in SYSCTL_DIRS:
        for name in ctx.target.listdir(directory):
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = f"{directory}/{name}"
    later = [chosen[n] for n in sorted(chosen) if n > CONF_NAME]
    later.append("/etc/sysctl.conf")
    notes = []
    for path in later:
        try:
            raw = ctx.target.read(path)
        except PermissionError as exc:  # a folder others can write (refused, issue 21.1): a note, not a failed plan
            notes.append(f"{path} not read ({exc.strerror or exc}): whether it sets {key} at boot is unknown")
            continue
        if raw is None:
            continue
        setting = conf_settings(raw.decode("utf-8", errors="replace")).get(_conf_key(key))
        if setting is not None:
            notes.append(f"{path} sets {key} = {setting} after {CONF_NAME}; the boot-time value will be {setting}")
    return notes


@actuator("sysctl", writes=("/proc/sys/**", CONF_PATH))
def plan_sysctl(finding: Finding, ctx: PlanContext) -> list[Action]:
    key, section = _KEY_OF_CHECK.get(finding.check, (finding.subject, ("sysctl", finding.subject)))
    action_id = f"sysctl:{key}"
    expectation = (ctx.profile.expectations_under("sysctl").get(key) if section[0] == "sysctl"
                   else ctx.profile.expectation(*section))
    if expectation is None:
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed, "the profile does not set this key")]
    try:
        path = sysctl_path(key)
    except InvalidName as exc:
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed, str(exc))]
    denied = protected_sysctl(path)
    if denied is not None and key not in ctx.profile.protected_sysctls:
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed,
                        f"{key} is security-relevant{'' if denied == key else f' ({denied})'}: remediate sets it "
                        "only from the operator's own profile listing it under remediate_protected_sysctls")]
    raw = ctx.target.read(path)
    if raw is None:
        return [refused(action_id, finding, ActionClass.SAFE, None,
                        f"the kernel has no sysctl {key} ({path} does not exist)")]
    current = parse_sysctl_value(raw)
    value = target_value(expectation)
    if value is None:
        return [refused(action_id, finding, ActionClass.SAFE, current,
                        f"the profile allows {expectation.describe()} but names no single value to set")]
    if expectation.evaluate(current).ok:
        return []
    problem = unsafe_for_config(key, value)
    if problem is not None:
        return [refused(action_id, finding, ActionClass.SAFE, current, problem)]
    return [Action(
        action_id, "sysctl", ActionClass.SAFE, key, finding.check, current, value,
        changes=(
            AttrWrite(path, value, parse_sysctl_value, shown_sysctl),
            FileEdit(CONF_PATH, lambda old: set_conf_key(old, key, value)),
        ),
        notes=later_overrides(ctx, key), expectation=expectation,
    )]
