#!/bin/sh
# ipmi_sim chassis_control hook: keeps power/boot state in files next to this script.
# From the project recipe /work/shared/peers/ipmi/chassis.sh. The power state starts as "on" (1)
# unless chassis-state/power says otherwise.
# usage: chassis.sh <mc> get parm... | chassis.sh <mc> set parm val...
d=$(dirname "$0")/chassis-state; mkdir -p "$d"
dev=$1; op=$2; shift 2
case $op in
  get) for p in "$@"; do case $p in
         power) echo "power:$(cat "$d/power" 2>/dev/null || echo 1)";;
         boot)  echo "boot:$(cat "$d/boot" 2>/dev/null || echo default)";;
         *) echo "Invalid parameter: $p"; exit 1;; esac; done;;
  set) while [ $# -ge 2 ]; do case $1 in
         power) echo "$2" > "$d/power";;
         boot)  echo "$2" > "$d/boot";;
         reset|identify) ;;
         *) echo "Invalid parameter: $1"; exit 1;; esac; shift 2; done;;
  check) exit 1;;
  *) echo "bad op $dev"; exit 1;;
esac
