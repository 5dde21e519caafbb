# Copyright: the nodewarden developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Shared code of the nodewarden.gpu modules: run the node's nodewarden CLI and shape its JSON for Ansible.

The CLI is always run with an argument list (no shell, no $VAR expansion), and every value is passed as one
C(--option=value) word, so a value that starts with a dash can never be read as another option.
Runs on the target's Python (3.8 or newer): no syntax newer than that outside annotations.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DEFAULT_EXECUTABLE_DIR = "/opt/nodewarden/bin"

# The exit codes of `nodewarden audit` and `nodewarden remediate`.
EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT, EXIT_COULD_NOT_RUN = 0, 1, 2, 3

# module option -> CLI option (values passed as `--flag=value`)
_SOURCE_OPTIONS = (
    ("snapshot", "--snapshot"),
    ("config", "--config"),
    ("bmc_url", "--bmc"),
    ("ipmi_host", "--ipmi"),
    ("bmc_user", "--bmc-user"),
    ("bmc_password_file", "--bmc-password-file"),
    ("bmc_ca_file", "--bmc-ca-file"),
)


def common_argument_spec() -> dict[str, Any]:
    """The options of the `nodewarden.gpu.common` doc fragment."""
    return {
        "profile": {"type": "str"},
        "snapshot": {"type": "path"},
        "config": {"type": "path"},
        "executable": {"type": "path"},
        "bmc_url": {"type": "str"},
        "ipmi_host": {"type": "str"},
        "bmc_user": {"type": "str"},
        # a path, not a secret; hidden all the same in case someone puts the password itself here
        "bmc_password_file": {"type": "path", "no_log": True},
        "bmc_ca_file": {"type": "path"},
        "bmc_insecure": {"type": "bool", "default": False},
    }


COMMON_MUTUALLY_EXCLUSIVE = [["bmc_ca_file", "bmc_insecure"]]


def executable(module: AnsibleModule) -> str:
    """The nodewarden command: the `executable` option, else /opt/nodewarden/bin/nodewarden, else PATH."""
    given = module.params.get("executable")
    if given:
        return str(given)
    return str(module.get_bin_path("nodewarden", required=True, opt_dirs=[DEFAULT_EXECUTABLE_DIR]))


def source_args(params: dict[str, Any]) -> list[str]:
    """The CLI options naming the node (live, snapshot, simulated), its config and BMC (what rollback takes too)."""
    args = [f"{flag}={params[key]}" for key, flag in _SOURCE_OPTIONS if params.get(key)]
    if params.get("simulate"):
        args.append(f"--simulate={params['simulate']}")
    if params.get("bmc_insecure"):
        args.append("--bmc-insecure")
    return args


def profile_args(params: dict[str, Any]) -> list[str]:
    return [f"--profile={params['profile']}"] if params.get("profile") else []


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text[-limit:]


def run_json(module: AnsibleModule, argv: list[str], **result: Any) -> tuple[int, dict[str, Any]]:
    """Run one CLI command (a list: no shell) and return its exit code and JSON; fail the task on exit 2/3."""
    # A list (no shell), and no $VAR/~ expansion either: every value reaches the CLI as written.
    rc, out, err = module.run_command(argv, expand_user_and_vars=False)
    what = f"nodewarden {argv[1]}"
    if rc == EXIT_BAD_INPUT:
        module.fail_json(msg=f"{what}: bad input (exit 2): {_tail(err) or _tail(out)}", rc=rc, **result)
    if rc == EXIT_COULD_NOT_RUN:
        module.fail_json(msg=f"{what}: could not run (exit 3): {_tail(err) or _tail(out)}", rc=rc, **result)
    if rc not in (EXIT_OK, EXIT_FINDINGS):
        module.fail_json(msg=f"{what} failed (exit {rc}): {_tail(err) or _tail(out)}", rc=rc, **result)
    try:
        parsed = json.loads(out)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        module.fail_json(msg=f"{what} printed no JSON object (exit {rc}): {_tail(err, 500)}", rc=rc, **result)
    return rc, parsed


def audit(module: AnsibleModule, exe: str, extra: list[str] | None = None) -> dict[str, Any]:
    """`nodewarden audit` (read-only, also in check mode): the report."""
    params = module.params
    argv = [exe, "audit", *source_args(params), *profile_args(params), "--format=json", *(extra or [])]
    return run_json(module, argv)[1]


def _render(action_id: str, value: Any) -> str:
    if isinstance(value, dict):
        return "".join(f"{action_id}.{key} = {json.dumps(value[key], sort_keys=True)}\n" for key in sorted(value))
    return f"{action_id} = {json.dumps(value, sort_keys=True)}\n"


def _render_pair(action_id: str, before: Any, after: Any) -> tuple[str, str]:
    """Before and after in the same shape, so the diff compares like with like.

    A before that maps each value to where it holds (the CPU governor: {"powersave": "0-223"}, governor ->
    CPUs) against one value for all is written as that value, where it holds in a comment:
    `cpu_governor:node = "powersave"  # 0-223` against `cpu_governor:node = "performance"`.
    """
    if isinstance(before, dict) and not isinstance(after, dict):
        lines = "".join(f"{action_id} = {json.dumps(value)}  # {where}\n" for value, where in sorted(before.items()))
        return lines, _render(action_id, after)
    return _render(action_id, before), _render(action_id, after)


def action_diff(actions: list[dict[str, Any]], not_allowed: list[dict[str, Any]] | None = None,
                ) -> list[dict[str, str]]:
    """One Ansible diff per action: its before and after, as `ID = VALUE` lines (a dict value: one per key).

    Actions the `allow` list filtered out come after them as `not allowed: ...` (a prepared diff: nothing
    would change, but the operator sees what a wider `allow` would do).
    """
    diffs: list[dict[str, str]] = []
    for a in actions:
        before, after = _render_pair(a["id"], a.get("before"), a.get("after"))
        diffs.append({"before_header": f"{a['id']} ({a.get('class')}, {a.get('subject')})", "after_header": a["id"],
                      "before": before, "after": after})
    for a in not_allowed or []:
        before, after = _render_pair(a["id"], a.get("before"), a.get("after"))
        diffs.append({"prepared": f"not allowed: {a['id']} ({a.get('class')}, {a.get('subject')}): "
                                  f"{a.get('reason') or 'its class is not in allow'}\n"
                                  + "".join(f"  now    {line}\n" for line in before.splitlines())
                                  + "".join(f"  would  {line}\n" for line in after.splitlines())})
    return diffs


def remediate(module: AnsibleModule, exe: str, allow: list[str], reboot_ok: bool, only: list[str],
              state_dir: str) -> dict[str, Any]:
    """`nodewarden remediate`: the plan in check mode, `--apply` otherwise. Returns the module result so far.

    Refused actions become warnings; an action that was applied but failed verification fails the task with
    the rollback command in `msg`.
    """
    params = module.params
    allowed = [c for c in allow if c != "reboot" or reboot_ok]
    if "reboot" in allow and not reboot_ok:
        module.warn("reboot-class actions were not allowed: set reboot_ok: true to stage them")
    argv = [exe, "remediate", *source_args(params), *profile_args(params), "--format=json",
            f"--state-dir={state_dir}"]
    argv += [f"--allow={c}" for c in allowed] + [f"--only={glob}" for glob in only]
    if not module.check_mode:
        argv.append("--apply")
    plan = run_json(module, argv, changed=False)[1]
    actions: list[dict[str, Any]] = list(plan.get("actions") or [])
    refused = [{"id": a["id"], "reason": a.get("reason")} for a in actions if a.get("status") == "refused"]
    failed = [{"id": a["id"], "reason": a.get("reason")} for a in actions if a.get("status") == "failed"]
    changing = [a for a in actions if a.get("status") in ("planned", "applied", "failed")
                and (module.check_mode or a.get("applied"))]
    result: dict[str, Any] = {
        "changed": bool(plan.get("changed")),
        "reboot_required": bool(plan.get("reboot_required")),
        "run_id": plan.get("run_id"),
        "mode": plan.get("mode"),
        "profile": plan.get("profile"),
        "actions": actions,
        "refused": refused,
        "findings": list(plan.get("findings") or []),
    }
    not_allowed = [a for a in actions if a.get("status") == "not_allowed"]
    result["not_allowed"] = [{"id": a["id"], "reason": a.get("reason")} for a in not_allowed]
    if module._diff and (changing or not_allowed):
        result["diff"] = action_diff(changing, not_allowed)
    for item in refused:
        module.warn(f"refused {item['id']}: {item['reason']}")
    if failed:
        rollback = [exe, "rollback", *source_args(params), f"--state-dir={state_dir}", str(plan.get("run_id"))]
        module.fail_json(msg="; ".join(f"{f['id']}: {f['reason']}" for f in failed)
                         + f" (roll back with: {' '.join(rollback)})", **result)
    return result
