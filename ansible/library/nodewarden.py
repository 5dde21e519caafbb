#!/usr/bin/python
# nodewarden Ansible module (deprecated): audit a GPU node, or remediate its drift, through the nodewarden CLI.
# Copyright: the nodewarden authors. License: same as nodewarden.
# A thin wrapper over the nodewarden.gpu collection (ansible/collections/ansible_collections/nodewarden/gpu),
# which must be on the controller's collections path: use nodewarden.gpu.audit_info and nodewarden.gpu.remediate.

from __future__ import annotations

from typing import Any

DOCUMENTATION = r"""
---
module: nodewarden
short_description: Audit a GPU server against its tuning profile, or remediate drift (deprecated)
deprecated:
  removed_at_date: "2027-12-01"
  why: The nodewarden.gpu collection replaces it, with BMC options, a read-only info module and FQCNs.
  alternative: Use M(nodewarden.gpu.audit_info) for I(state=audited) and M(nodewarden.gpu.remediate) for
    I(state=remediated).
description:
  - Deprecated thin wrapper over the nodewarden.gpu collection, which must be on the controller's
    collections path (the playbooks in C(ansible/) find it next to them).
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
    description: Path of the nodewarden command; default is /opt/nodewarden/bin/nodewarden, else looked up in PATH.
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


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodewarden.gpu.plugins.module_utils.nodewarden import audit, executable, remediate


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
    module.deprecate("the nodewarden module is replaced by nodewarden.gpu.audit_info (state=audited) and "
                     "nodewarden.gpu.remediate (state=remediated)", date="2027-12-01", collection_name="nodewarden.gpu")
    params = module.params
    exe = executable(module)
    result: dict[str, Any] = {"changed": False, "reboot_required": False}
    if params["state"] == "remediated":
        result.update(remediate(module, exe, params["allow"], params["reboot_ok"], params["only"], params["state_dir"]))
    # The report after any change: what the operator and the fleet report see.
    report = audit(module, exe)
    result.update(report=report, summary=report.get("summary", {}))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
