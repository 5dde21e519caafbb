#!/usr/bin/env bash
# Installs what tests/test_monitoring.py needs: promtool (check and unit-test the alerting rules)
# and the prometheus server binary (parse every Grafana panel expression through the real
# query API). Debian/Ubuntu package `prometheus` (bookworm: 2.42). Idempotent: does nothing when
# both binaries are already on PATH. Run as root (CI is).
#
# The package's postinst tries to start prometheus.service. In containers /usr/sbin/policy-rc.d
# (exit 101) denies that and nothing runs; where no policy-rc.d exists and systemd is PID 1 the
# service may start on :9090. The tests do not use it: they run their own server on a free port.
# Recipe: ../shared/peers/30-prometheus.sh and ../shared/peers/README.md section 4.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "peers-prometheus: promtool and prometheus already installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus
command -v promtool >/dev/null && command -v prometheus >/dev/null || {
  echo "peers-prometheus: package prometheus installed but promtool/prometheus are not on PATH" >&2; exit 1; }
echo "peers-prometheus: installed $(dpkg-query -W -f='prometheus ${Version}' prometheus)"
