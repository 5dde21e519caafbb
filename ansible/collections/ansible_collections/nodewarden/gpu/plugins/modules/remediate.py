#!/usr/bin/python
# Copyright: the nodewarden developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: remediate
short_description: Fix a GPU server's drift from its tuning profile with nodewarden
version_added: 0.1.0
description:
  - Runs C(nodewarden remediate --apply) on the target, or in check mode C(nodewarden remediate) without
    C(--apply), which only plans and predicts RV(changed) and RV(reboot_required) without acting.
  - One action per finding an actuator can fix (sysctl, transparent huge pages, MTU, CPU governor, GPU
    persistence, compute mode, ECC, power limit and application clocks, PCIe ACS, BIOS attributes through
    the BMC). Each change is journaled on the target before it is written and verified after it; a second
    run changes nothing.
  - C(nodewarden rollback RUN_ID) (or C(--last)) on the target undoes a run; RV(run_id) names it.
  - BIOS attribute fixes are Redfish PATCHes to the BMC's BIOS settings object, so they need O(bmc_url),
    O(bmc_user) and O(bmc_password_file) on a live node (or the same in the config file), O(allow) with
    V(reboot) and O(reboot_ok=true). They are staged for the next boot and set RV(reboot_required);
    this module never reboots.
author:
  - nodewarden developers (@nodewarden)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - nodewarden.gpu.common
attributes:
  check_mode:
    support: full
    details: Check mode runs the plan only (C(nodewarden remediate) without C(--apply)).
  diff_mode:
    support: full
    details: One diff per action, its before and after state.
  platform:
    platforms: posix
options:
  allow:
    description:
      - Action classes allowed. V(safe) is always allowed; V(disruptive) actions need drained GPUs (the CLI
        refuses while processes run); V(reboot) actions are only staged with O(reboot_ok=true).
    type: list
    elements: str
    choices: [safe, disruptive, reboot]
    default: [safe]
  only:
    description:
      - Globs over action ids (V(sysctl:*), V(mtu:eth2)) or check ids (V(net.mtu)). Empty means every action.
    type: list
    elements: str
    default: []
  reboot_ok:
    description:
      - Allow reboot-class actions (ECC mode, BIOS attributes) to be staged. The playbook decides when to reboot.
    type: bool
    default: false
  state_dir:
    description:
      - Folder on the target for the remediation journal (C(RUN_ID/) per run). It and every folder above it must
        belong to root or the remote user and be writable by nobody else.
    type: path
    default: /var/lib/nodewarden
  audit_after:
    description:
      - Run a read-only C(nodewarden audit) after the change and return its RV(summary). Set V(false) to spare a
        fragile BMC a second full read.
    type: bool
    default: true
notes:
  - The CLI holds a lock per node, so two runs on one node at the same time fail the second with C(could not run).
  - Refused actions are warnings, not failures. An action applied but not verified fails the task; C(msg) names
    the rollback command.
seealso:
  - module: nodewarden.gpu.audit_info
requirements:
  - nodewarden installed on the target (C(/opt/nodewarden/bin/nodewarden) or in E(PATH)).
"""

EXAMPLES = r"""
- name: Predict the safe fixes (run the playbook with --check --diff), or apply them
  nodewarden.gpu.remediate:
  register: fix

- name: Only sysctls and transparent huge pages
  nodewarden.gpu.remediate:
    only: ["sysctl:*", "thp:*"]

- name: Stage BIOS settings through the BMC, then reboot where needed
  nodewarden.gpu.remediate:
    allow: [safe, reboot]
    reboot_ok: true
    bmc_url: "https://{{ bmc_address }}"
    bmc_user: nodewarden
    bmc_password_file: /etc/nodewarden/bmc-password
    bmc_ca_file: /etc/nodewarden/bmc-ca.pem
  register: fix

- name: Reboot to apply staged settings
  ansible.builtin.reboot:
  when: fix.reboot_required

- name: The same BMC options for every nodewarden.gpu task
  module_defaults:
    group/nodewarden.gpu.nodewarden:
      bmc_url: "https://{{ bmc_address }}"
      bmc_user: nodewarden
      bmc_password_file: /etc/nodewarden/bmc-password
  block:
    - name: Fix drained nodes, disruptive actions included
      nodewarden.gpu.remediate:
        allow: [safe, disruptive]
"""

RETURN = r"""
changed:
  description: Whether anything was changed (in check mode, would be).
  type: bool
  returned: always
reboot_required:
  description: A reboot-class action was applied (in check mode, planned) and takes effect at the next boot.
  type: bool
  returned: always
run_id:
  description: Journal id of the run, for C(nodewarden rollback RUN_ID). Null in check mode and when nothing changed.
  type: str
  returned: success
  sample: 20261201T120000Z-3f2a1c
mode:
  description: V(plan) (check mode) or V(apply).
  type: str
  returned: success
  sample: apply
profile:
  description: The profile the node was remediated towards.
  type: str
  returned: success
  sample: hgx-h100-sxm
actions:
  description:
    - Every action, as C(nodewarden remediate --format json) prints it.
    - C(status) is one of V(planned), V(applied), V(refused), V(not_allowed), V(failed).
  type: list
  elements: dict
  returned: success
  sample:
    - id: "sysctl:net.core.rmem_max"
      class: safe
      subject: net.core.rmem_max
      finding: host.sysctl
      before: "4194304"
      after: "134217728"
      status: applied
      applied: true
      verified: true
      observed_after: "134217728"
      reason: null
      notes: []
refused:
  description: Actions the CLI refused, with the reason (also shown as warnings).
  type: list
  elements: dict
  returned: success
  sample: [{"id": "thp:enabled", "reason": "transparent_hugepage=always on the kernel command line"}]
not_allowed:
  description:
    - Actions the O(allow) list left out (their class is not allowed), with the reason. In diff mode each
      one is shown after the changes, headed C(not allowed), with its reason and its current and wanted
      values; nothing is done about them.
  type: list
  elements: dict
  returned: success
  sample: [{"id": "acs:0000:b9:02.0", "reason": "class disruptive not allowed (--allow disruptive)"}]
findings:
  description: The findings the run fixed (verified after the change).
  type: list
  elements: dict
  returned: success
summary:
  description: Finding counts of a read-only audit after the run (V(pass), V(warn), V(fail), V(unknown), V(skip),
    V(waived), V(fixed)). In check mode, the node as it is.
  type: dict
  returned: when O(audit_after=true)
  sample: {"pass": 311, "warn": 5, "fail": 22, "unknown": 0, "skip": 21, "waived": 0, "fixed": 0}
diff:
  description: One entry per changed (in check mode, planned) action, with its before and after state.
  type: list
  elements: dict
  returned: in diff mode, when something changes
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodewarden.gpu.plugins.module_utils.nodewarden import (
    COMMON_MUTUALLY_EXCLUSIVE,
    audit,
    common_argument_spec,
    executable,
    remediate,
)


def main() -> None:
    argument_spec = common_argument_spec()
    argument_spec.update(
        allow={"type": "list", "elements": "str", "choices": ["safe", "disruptive", "reboot"], "default": ["safe"]},
        only={"type": "list", "elements": "str", "default": []},
        reboot_ok={"type": "bool", "default": False},
        state_dir={"type": "path", "default": "/var/lib/nodewarden"},
        audit_after={"type": "bool", "default": True},
    )
    module = AnsibleModule(argument_spec=argument_spec, mutually_exclusive=COMMON_MUTUALLY_EXCLUSIVE,
                           supports_check_mode=True)
    params = module.params
    exe = executable(module)
    result = remediate(module, exe, params["allow"], params["reboot_ok"], params["only"], params["state_dir"])
    if params["audit_after"]:
        result["summary"] = audit(module, exe).get("summary", {})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
