#!/usr/bin/python
# nodewarden Ansible module: audit a GPU node, or remediate its drift, through the nodewarden CLI.
# Copyright: the nodewarden authors. License: same as nodewarden.

from __future__ import annotations

import json
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: nodewarden
short_description: Audit a GPU server against its tuning profile, or remediate drift
description:
  - Runs C(nodewarden audit) or C(nodewarden remediate) on the target host and returns the JSON result.
  - With I(state=remediated), check mode runs the plan only and predicts C(changed) without acting;
    C(--diff) shows each action's before and after. A second run changes nothing.
  - Changes are journaled on the host; C(nodewarden rollback --last) undoes the last run.
options:
  state:
    description: C(audited) reports findings and never changes anything; C(remediated) applies fixes.
    type: str
    choices: [audited, remediated]
    default: audited
  allow:
    description: Action classes allowed beyond C(safe). C(reboot) is only honoured with I(reboot_ok).
    type: list
    elements: str
    choices: [safe, disruptive, reboot]
    default: [safe]
  only:
    description: Globs over action ids (C(sysctl:*)) or check ids (C(net.mtu)); empty means all.
    type: list
    elements: str
    default: []
  profile:
    description: Profile name to judge by; default matches the hardware automatically.
    type: str
  reboot_ok:
    description: Allow reboot-class actions (staged; the playbook decides when to reboot).
    type: bool
    default: false
  snapshot:
    description: Work on a recorded node directory instead of the live host (practice, tests).
    type: path
  config:
    description: nodewarden config file.
    type: path
  state_dir:
    description: Where the remediation journal and lock live.
    type: path
    default: /var/lib/nodewarden
  executable:
    description: Path of the nodewarden command; default is looked up in PATH.
    type: path
author:
  - nodewarden authors
"""

EXAMPLES = r"""
- name: Audit the node
  nodewarden:
    state: audited
  register: audit

- name: Fix safe drift (sysctl, THP, MTU, CPU governor), predicting in check mode
  nodewarden:
    state: remediated
    only: ["sysctl:*", "thp:*"]
  register: fix

- name: Allow disruptive actions on drained nodes
  nodewarden:
    state: remediated
    allow: [safe, disruptive]
"""

RETURN = r"""
changed:
  description: Whether anything was (or, in check mode, would be) changed.
  type: bool
  returned: always
reboot_required:
  description: A reboot-class action was applied (or planned) and needs a reboot to take effect.
  type: bool
  returned: always
run_id:
  description: Journal id of the remediation run (for C(nodewarden rollback RUN_ID)); null when nothing changed.
  type: str
  returned: state=remediated
actions:
  description: Remediation actions with id, class, subject, before, after, status, verified, reason.
  type: list
  elements: dict
  returned: state=remediated
refused:
  description: Actions that were refused, with the reason.
  type: list
  elements: dict
  returned: state=remediated
report:
  description: The audit report (nodewarden.report/v1) after any changes.
  type: dict
  returned: success
summary:
  description: Finding counts of the report (pass, warn, fail, unknown, skip, waived, fixed).
  type: dict
  returned: success
"""


def _source_args(params: dict[str, Any]) -> list[str]:
    args: list[str] = []
    if params["snapshot"]:
        args += ["--snapshot", params["snapshot"]]
    if params["config"]:
        args += ["--config", params["config"]]
    return args


def _run_json(module: AnsibleModule, argv: list[str], ok_codes: tuple[int, ...]) -> tuple[int, dict[str, Any]]:
    rc, out, err = module.run_command(argv)  # a list: no shell
    if rc not in ok_codes:
        module.fail_json(msg=f"{' '.join(argv[1:3])} failed (exit {rc}): {err.strip() or out.strip()}", rc=rc)
    try:
        return rc, json.loads(out)
    except ValueError:
        module.fail_json(msg=f"nodewarden printed no JSON (exit {rc}): {err.strip()[-500:]}", rc=rc)
    raise AssertionError("unreachable")


def _diff(actions: list[dict[str, Any]]) -> dict[str, str]:
    def lines(key: str) -> str:
        return "".join(f"{a['id']} = {json.dumps(a[key])}\n" for a in actions)
    return {"before_header": "nodewarden: before", "after_header": "nodewarden: after",
            "before": lines("before"), "after": lines("after")}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["audited", "remediated"], default="audited"),
            allow=dict(type="list", elements="str", choices=["safe", "disruptive", "reboot"], default=["safe"]),
            only=dict(type="list", elements="str", default=[]),
            profile=dict(type="str"),
            reboot_ok=dict(type="bool", default=False),
            snapshot=dict(type="path"),
            config=dict(type="path"),
            state_dir=dict(type="path", default="/var/lib/nodewarden"),
            executable=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    exe = params["executable"] or module.get_bin_path("nodewarden", required=True)
    source = _source_args(params)
    profile = ["--profile", params["profile"]] if params["profile"] else []
    result: dict[str, Any] = {"changed": False, "reboot_required": False}

    if params["state"] == "remediated":
        allow = [c for c in params["allow"] if c != "reboot" or params["reboot_ok"]]
        if "reboot" in params["allow"] and not params["reboot_ok"]:
            module.warn("reboot-class actions were not allowed: set reboot_ok: true to stage them")
        argv = [exe, "remediate", *source, *profile, "--format", "json", "--state-dir", params["state_dir"]]
        argv += [x for c in allow for x in ("--allow", c)] + [x for g in params["only"] for x in ("--only", g)]
        if not module.check_mode:
            argv.append("--apply")
        _, plan = _run_json(module, argv, (0, 1))
        actions = plan.get("actions", [])
        refused = [{"id": a["id"], "reason": a["reason"]} for a in actions if a["status"] == "refused"]
        failed = [{"id": a["id"], "reason": a["reason"]} for a in actions if a["status"] == "failed"]
        changing = [a for a in actions if a["status"] in ("planned", "applied", "failed") and (
            module.check_mode or a["applied"])]
        result.update(changed=bool(plan.get("changed")), reboot_required=bool(plan.get("reboot_required")),
                      run_id=plan.get("run_id"), actions=actions, refused=refused)
        if module._diff and changing:
            result["diff"] = _diff(changing)
        for item in refused:
            module.warn(f"refused {item['id']}: {item['reason']}")
        if failed:
            module.fail_json(msg="; ".join(f"{f['id']}: {f['reason']}" for f in failed) +
                             f" (roll back with: nodewarden rollback {plan.get('run_id')})", **result)

    # The report after any change: what the operator and the fleet report see.
    _, report = _run_json(module, [exe, "audit", *source, *profile, "--format", "json"], (0, 1))
    result.update(report=report, summary=report.get("summary", {}))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
