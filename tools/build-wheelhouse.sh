#!/usr/bin/env bash
# build-wheelhouse.sh: nodewarden and its runtime dependencies as wheels, for a machine with no network
# (issue 31.7: the lent GPU machine). tools/gpu-live-check.sh installs from ./wheelhouse with
# `pip --no-index` when no ./.venv is carried (a venv is ~340 MiB; the carry limit is 64 MiB).
#
# Usage: tools/build-wheelhouse.sh [DIR]         (default ./wheelhouse)
#   TARGETS="3.11:manylinux2014_x86_64 ..."     which Python versions and platforms to fetch for;
#                                               default: CPython 3.10-3.13 on x86_64 and aarch64 (Grace)
#   MAX_MIB=64                                  refuse a wheelhouse larger than this
# Needs a package index (the one pip is configured with); run it where there is network, then carry DIR.
set -euo pipefail
DIR=${1:-./wheelhouse}
MAX_MIB=${MAX_MIB:-64}
PY=${PYTHON:-python3}
DEFAULT_TARGETS=""
for version in 3.10 3.11 3.12 3.13; do
    for platform in manylinux2014_x86_64 manylinux2014_aarch64; do
        DEFAULT_TARGETS="$DEFAULT_TARGETS $version:$platform"
    done
done
TARGETS=${TARGETS:-$DEFAULT_TARGETS}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$DIR"
# nodewarden itself (pure Python), without its dependencies: those come per target below
"$PY" -m pip wheel -q --no-deps --wheel-dir "$DIR" "$here"
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$PY" - "$here/pyproject.toml" > "$requirements" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
EOF
for target in $TARGETS; do
    version=${target%%:*}
    platform=${target#*:}
    "$PY" -m pip download -q --dest "$DIR" --only-binary=:all: --python-version "$version" \
        --platform "$platform" --implementation cp -r "$requirements"
done
size_kib=$(du -sk "$DIR" | cut -f1)
if [ "$size_kib" -gt $(( MAX_MIB * 1024 )) ]; then
    echo "build-wheelhouse: $DIR is $(( size_kib / 1024 )) MiB, more than $MAX_MIB MiB" >&2
    exit 1
fi
echo "build-wheelhouse: $(find "$DIR" -name '*.whl' | wc -l) wheels, $(( size_kib / 1024 )) MiB in $DIR"
