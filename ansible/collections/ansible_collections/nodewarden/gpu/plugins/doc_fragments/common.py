# Copyright: the nodewarden developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Options every nodewarden.gpu module shares: where the node is read from, the profile, the BMC."""

from __future__ import annotations


class ModuleDocFragment:

    DOCUMENTATION = r"""
options:
  profile:
    description:
      - Profile to judge the node by (for example V(hgx-h100-sxm)). Default is to match the hardware.
    type: str
  snapshot:
    description:
      - Work on a recorded node directory on the target (C(nodewarden snapshot capture)) instead of the
        live host. For practice and tests.
    type: path
  config:
    description:
      - nodewarden config file on the target. The CLI reads C(/etc/nodewarden/config.yaml) when it exists
        and this is not set; BMC settings (C(bmc.url), C(bmc.password_file)) can come from there.
    type: path
  executable:
    description:
      - Path of the C(nodewarden) command on the target.
      - Default is C(/opt/nodewarden/bin/nodewarden) (where the shipped systemd units run it) when it exists,
        else C(nodewarden) looked up in E(PATH).
      - It is run with an argument list, never through a shell.
    type: path
  bmc_url:
    description:
      - Redfish service of the node's BMC (C(https://host)), passed as C(--bmc).
      - Needed live for BIOS attribute fixes and BMC checks; the BIOS change is a Redfish PATCH to the
        BIOS settings object.
    type: str
  ipmi_host:
    description:
      - IPMI-over-LAN BMC (C(HOST[:PORT])) for BMCs without usable Redfish, passed as C(--ipmi). Read-only.
    type: str
  bmc_user:
    description:
      - BMC user name.
    type: str
  bmc_password_file:
    description:
      - File on the target holding the BMC password, readable by its owner only (the CLI refuses
        anything else).
      - There is deliberately no option for the password itself, so it never travels in module arguments.
        The path is treated as sensitive anyway and hidden from logs and output.
    type: path
  bmc_ca_file:
    description:
      - CA bundle on the target to verify the BMC's TLS certificate against. Default is the system's CA bundle.
      - Mutually exclusive with O(bmc_insecure).
    type: path
  bmc_insecure:
    description:
      - Do not verify the BMC's TLS certificate. nodewarden reports this as a warning finding.
    type: bool
    default: false
"""
