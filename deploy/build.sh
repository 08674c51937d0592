#!/usr/bin/env bash
# Installs what is missing, then configures and builds fusor in ./build
# (two parallel jobs, ccache when present). Safe to run repeatedly.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/install-deps.sh"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
if [ ! -f "$root/build/build.ninja" ]; then
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$root/build" -j "${FUSOR_BUILD_JOBS:-2}"
