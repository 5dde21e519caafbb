#!/usr/bin/env bash
# Install the Redfish test peers into two isolated virtualenvs (idempotent).
#
#   ${PEERS_VENV_DIR:-<repo>/.peers}/sushy  sushy-tools  -> bin/sushy-static (read-only mockup server)
#   ${PEERS_VENV_DIR:-<repo>/.peers}/mitm   mitmproxy    -> bin/mitmdump      (fault-injecting proxy)
#   ${PEERS_VENV_DIR:-<repo>/.peers}/emulator sushy-tools -> bin/sushy-emulator (writable BIOS, libvirt test driver)
#
# Their dependencies (Flask, mitmproxy's pinned stack) never touch the project's venv;
# tests/peers/redfish.py starts the console scripts from here by absolute path.
# Needs only python3 (with venv/ensurepip) and PyPI. A venv whose console script already
# exists is left alone, so a second run costs well under a second.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${PEERS_VENV_DIR:-$REPO/.peers}
PY=${PYTHON:-python3}
SUSHY_SPEC=${SUSHY_TOOLS_SPEC:-sushy-tools==2.2.0}
MITM_SPEC=${MITMPROXY_SPEC:-mitmproxy==11.0.2}   # 11.0.2 is the last release for Python 3.11
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ensure NAME SCRIPT SPEC: create $DIR/NAME and install SPEC unless bin/SCRIPT is already there
ensure() {
  local name=$1 script=$2 spec=$3 venv=$DIR/$1 t
  t=$(now)
  if [ -x "$venv/bin/$script" ]; then
    echo "peers-redfish: $name: $venv/bin/$script present, skipping install ($(since "$t") s)"
    return 0
  fi
  if [ ! -x "$venv/bin/python" ] && ! "$PY" -m venv "$venv"; then
    echo "peers-redfish: '$PY -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
    rm -rf "$venv"; return 1
  fi
  "$venv/bin/python" -m pip install -q "$spec"
  [ -x "$venv/bin/$script" ] || { echo "peers-redfish: $spec did not install $script" >&2; return 1; }
  echo "peers-redfish: $name: installed $spec in $(since "$t") s"
}

# ensure_emulator: sushy-emulator whose BIOS is writable. Its libvirt driver needs the libvirt
# binding, taken from Debian (python3-libvirt, for /usr/bin/python3) instead of compiling
# libvirt-python; libvirt's built-in test:///default driver needs no daemon.
ensure_emulator() {
  local venv=$DIR/emulator t
  t=$(now)
  if [ -x "$venv/bin/sushy-emulator" ]; then
    echo "peers-redfish: emulator: present, skipping install ($(since "$t") s)"
    return 0
  fi
  if ! /usr/bin/python3 -c 'import libvirt' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-libvirt >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
          python3-libvirt >/dev/null; }
  fi
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q "$SUSHY_SPEC"
  "$venv/bin/python" -c 'import libvirt; libvirt.open("test:///default").close()'
  echo "peers-redfish: emulator: installed $SUSHY_SPEC with Debian's libvirt binding in $(since "$t") s"
}

start=$(now)
mkdir -p "$DIR"
ensure sushy sushy-static "$SUSHY_SPEC"
ensure mitm mitmdump "$MITM_SPEC"
ensure_emulator
echo "peers-redfish: ready in $DIR (total $(since "$start") s)"
