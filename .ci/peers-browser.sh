#!/usr/bin/env bash
# Installs headless Chromium (Debian package `chromium`) for tests/test_fleet.py, which opens the
# fleet report's HTML, takes a screenshot and checks for console errors. Idempotent. Run as root.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "peers-browser: chromium already installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
command -v chromium >/dev/null || { echo "peers-browser: chromium did not install" >&2; exit 1; }
echo "peers-browser: installed $(chromium --version 2>/dev/null | head -1)"
