#!/usr/bin/env bash
# gpu-live-check.sh: record a real GPU machine, read-only, in one bounded call (issue 31.7).
#
# What it writes, all under $OUT (default ./gpu-live-check-out): nvidia-smi -q -x, nvidia-smi topo -m,
# lspci -nn -vvv, dmesg, nodewarden's own capture (`snapshot capture`: the NVML recording through our
# reader, every call and its return code, with host files and kernel log), a live `audit --format json`,
# and timings.tsv (each step's wall time and exit status). Nothing is changed on the machine: no
# setting, no remediation, no load unless --load is given (then `accept --duration 2m --load torch`,
# which only reads and runs the load). Every step has its own timeout and the whole run stops by
# TOTAL_S (8 minutes) whatever happens; a missing tool is a line in timings.tsv, not a failure.
#
# nodewarden itself: $NODEWARDEN, else ./.venv/bin/nodewarden, else a venv made from ./wheelhouse
# (pip --no-index: the machine has no network), else `python3 -m agent` from this checkout.
# Usage: OUT=/path tools/gpu-live-check.sh [--load]
set -u
TOTAL_S=${TOTAL_S:-480}
STEP_S=${STEP_S:-120}
OUT=${OUT:-./gpu-live-check-out}
LOAD=0
[ "${1:-}" = "--load" ] && LOAD=1
start=$(date +%s)
mkdir -p "$OUT"
state=$(mktemp -d)   # nodewarden's state (journal, baseline) never touches the machine's /var/lib
trap 'rm -rf "$state"' EXIT
printf 'step\texit\tseconds\n' > "$OUT/timings.tsv"

left() { echo $(( TOTAL_S - ($(date +%s) - start) )); }

step() {  # step NAME OUTFILE COMMAND...: bounded by STEP_S and what is left of TOTAL_S
    local name=$1 out=$2; shift 2
    local budget; budget=$(left)
    [ "$budget" -gt "$STEP_S" ] && budget=$STEP_S
    if [ "$budget" -le 5 ]; then printf '%s\tskipped (total time spent)\t0\n' "$name" >> "$OUT/timings.tsv"; return; fi
    if ! command -v "$1" >/dev/null 2>&1 && [ ! -x "$1" ]; then
        printf '%s\tnot installed (%s)\t0\n' "$name" "$1" >> "$OUT/timings.tsv"; return
    fi
    local t0 rc; t0=$(date +%s.%N)
    timeout -k 5 "$budget" "$@" > "$OUT/$out" 2> "$OUT/$out.stderr"; rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo ?)" >> "$OUT/timings.tsv"
}

nodewarden_cmd() {
    if [ -n "${NODEWARDEN:-}" ]; then echo "$NODEWARDEN"; return; fi
    if [ -x ./.venv/bin/nodewarden ]; then echo ./.venv/bin/nodewarden; return; fi
    if [ -d ./wheelhouse ] && python3 -m venv "$state/venv" >/dev/null 2>&1 \
        && "$state/venv/bin/pip" install -q --no-index --find-links ./wheelhouse nodewarden >/dev/null 2>&1; then
        echo "$state/venv/bin/nodewarden"; return
    fi
    echo "python3 -m agent"
}
NW=$(nodewarden_cmd)
echo "nodewarden: $NW" > "$OUT/nodewarden.txt"

step nvidia-smi-q-x nvidia-smi-q.xml nvidia-smi -q -x
step nvidia-smi-topo nvidia-smi-topo.txt nvidia-smi topo -m
step lspci lspci-nn-vvv.txt lspci -nn -vvv
step dmesg dmesg.txt dmesg
step uname uname.txt uname -a
# shellcheck disable=SC2086 # NW may be "python3 -m agent"
step snapshot snapshot.log $NW snapshot capture --out "$OUT/snapshot"
# shellcheck disable=SC2086
step audit audit.json $NW audit --format json
if [ "$LOAD" = 1 ]; then
    # shellcheck disable=SC2086
    step accept accept.json $NW accept --duration 2m --load torch --format json
fi
printf 'total\t0\t%s\n' "$(( $(date +%s) - start ))" >> "$OUT/timings.tsv"
cat "$OUT/timings.tsv"
