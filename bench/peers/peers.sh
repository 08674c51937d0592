#!/usr/bin/env bash
# The peer benchmark in its own Python environment (deploy/peers-env.sh):
#   bench/peers/peers.sh [--torch] [peers.py arguments...]
# --torch adds PyTorch and OpenVINO to the environment (a large download);
# without it their rows say "not installed". See bench/peers/peers.py --help.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
env_args=()
if [ "${1:-}" = "--torch" ]; then
  env_args=(--torch)
  shift
fi
python="$("$root/deploy/peers-env.sh" "${env_args[@]}" | tail -n 1)"
exec "$python" "$root/bench/peers/peers.py" "$@"
