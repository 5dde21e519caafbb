#!/usr/bin/env bash
# Installs what tests/test_ipmi.py needs: OpenIPMI's BMC simulator (ipmi_sim, sdrcomp; package
# openipmi) and ipmitool (handy to poke the simulator by hand). Idempotent: does nothing when
# ipmi_sim and sdrcomp are already on PATH. Debian/Ubuntu, run as root (CI is).
# Recipe: ../shared/peers/20-ipmi-sim.sh and ../shared/peers/README.md section 3b.
set -euo pipefail
if command -v ipmi_sim >/dev/null 2>&1 && command -v sdrcomp >/dev/null 2>&1; then
  echo "peers-ipmi: ipmi_sim and sdrcomp already installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends openipmi ipmitool
command -v ipmi_sim >/dev/null && command -v sdrcomp >/dev/null || {
  echo "peers-ipmi: openipmi installed but ipmi_sim/sdrcomp are not on PATH" >&2; exit 1; }
echo "peers-ipmi: installed $(dpkg-query -W -f='openipmi ${Version}' openipmi)"
