#!/usr/bin/env bash
# Installs what fusor needs to build and run on Debian 12, idempotently:
# packages already present are left alone, and nothing is downloaded when
# everything is installed. Run as root or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev sqlite3 libspdlog-dev libabsl-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libopenblas-openmp-dev libdnnl-dev libonnx-dev libyaml-cpp-dev
  libssl-dev openssl curl
  clang libclang-rt-14-dev shellcheck yamllint python3-yaml python3-venv systemd
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
