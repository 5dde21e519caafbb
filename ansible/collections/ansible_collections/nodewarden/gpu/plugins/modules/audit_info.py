#!/usr/bin/python
# Copyright: the nodewarden developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: audit_info
short_description: Audit a GPU server against its tuning profile with nodewarden (read-only)
version_added: 0.1.0
description:
  - Runs C(nodewarden audit --format json) on the target and returns the report. Never changes anything, in or
    out of check mode, and never reports C(changed).
  - Reads the BMC (Redfish or IPMI) when O(bmc_url) or O(ipmi_host) is given or configured on the node.
  - Failing findings are part of the result, not a failed task; test RV(summary) in the playbook to gate on them.
author:
  - nodewarden developers (@nodewarden)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - nodewarden.gpu.common
attributes:
  check_mode:
    support: full
    details: The audit is read-only, so it runs the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  simulate:
    description:
      - Audit one of the simulated nodes shipped with nodewarden (for example V(hgx-h100-drifted)) instead of the
        live host.
      - Mutually exclusive with O(snapshot).
    type: str
  only:
    description:
      - Run only checks whose id matches one of these globs (V(gpu.*), V(host.sysctl)).
    type: list
    elements: str
    default: []
  skip:
    description:
      - Skip checks whose id matches one of these globs.
    type: list
    elements: str
    default: []
seealso:
  - module: nodewarden.gpu.remediate
requirements:
  - nodewarden installed on the target (C(/opt/nodewarden/bin/nodewarden) or in E(PATH)).
"""

EXAMPLES = r"""
- name: Audit the node
  nodewarden.gpu.audit_info:
  register: audit

- name: Fail the play on failing findings
  ansible.builtin.assert:
    that: audit.summary.fail == 0
    fail_msg: "{{ audit.report.findings | selectattr('status', 'eq', 'fail') | map(attribute='check') | list }}"

- name: Audit the node and its BMC
  nodewarden.gpu.audit_info:
    bmc_url: "https://{{ bmc_address }}"
    bmc_user: monitor
    bmc_password_file: /etc/nodewarden/bmc-password
    only: ["bmc.*", "bios.*", "crosscheck.*"]
"""

RETURN = r"""
report:
  description: The audit report (schema V(nodewarden.report/v1)) with every finding, its evidence and the sources.
  type: dict
  returned: success
summary:
  description: Finding counts (V(pass), V(warn), V(fail), V(unknown), V(skip), V(waived), V(fixed)).
  type: dict
  returned: success
  sample: {"pass": 299, "warn": 5, "fail": 34, "unknown": 0, "skip": 21, "waived": 0, "fixed": 0}
profile:
  description: The profile that judged the node.
  type: str
  returned: success
  sample: hgx-h100-sxm
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodewarden.gpu.plugins.module_utils.nodewarden import (
    COMMON_MUTUALLY_EXCLUSIVE,
    audit,
    common_argument_spec,
    executable,
)


def main() -> None:
    argument_spec = common_argument_spec()
    argument_spec.update(
        simulate={"type": "str"},
        only={"type": "list", "elements": "str", "default": []},
        skip={"type": "list", "elements": "str", "default": []},
    )
    module = AnsibleModule(argument_spec=argument_spec,
                           mutually_exclusive=[*COMMON_MUTUALLY_EXCLUSIVE, ["simulate", "snapshot"]],
                           supports_check_mode=True)
    params = module.params
    extra = [f"--only={glob}" for glob in params["only"]] + [f"--skip={glob}" for glob in params["skip"]]
    report = audit(module, executable(module), extra)
    module.exit_json(changed=False, report=report, summary=report.get("summary", {}), profile=report.get("profile"))


if __name__ == "__main__":
    main()
