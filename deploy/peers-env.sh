#!/usr/bin/env bash
# The Python environment of the peer benchmark (bench/peers): a virtualenv
# with numpy, onnx and onnxruntime from PyPI, and PyTorch and OpenVINO with
# --torch. Idempotent: nothing is downloaded when they are there. Prints the
# environment's python on its last line.
#   FUSOR_PEERS_VENV  where the environment lives (default ~/.cache/fusor/peers-venv)
set -euo pipefail
venv="${FUSOR_PEERS_VENV:-$HOME/.cache/fusor/peers-venv}"
want=(numpy onnx onnxruntime)
if [ "${1:-}" = "--torch" ]; then
  want+=(torch openvino)
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "peers-env: creating $venv" >&2
  python3 -m venv "$venv" >&2
fi
missing=()
for module in "${want[@]}"; do
  if ! "$venv/bin/python" -c "import $module" > /dev/null 2>&1; then
    missing+=("$module")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "peers-env: installing ${missing[*]} from PyPI" >&2
  "$venv/bin/python" -m pip install --quiet "${missing[@]}" >&2
fi
echo "$venv/bin/python"
