#!/usr/bin/env bash
# The Python package's test environment: a virtualenv with pytest, mypy and
# the package's build tools (setuptools, grpcio-tools), filled from PyPI the
# first time, and the package built from ./python (its dependencies, grpcio,
# protobuf and numpy, come from PyPI the first time too). The package is
# built and installed again on every run, with the environment's build tools
# (no PyPI then), so the tests see the working tree. Prints the
# environment's python on its last line.
#   FUSOR_PYTHON_VENV  where the environment lives (default ~/.cache/fusor/python-venv)
#   FUSOR_PYTHON_TORCH=1  also installs PyTorch and transformers (the PyTorch backend's tests; a 2.7 GB
#                         download, 5.5 GB installed, the first time)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FUSOR_PYTHON_VENV:-$HOME/.cache/fusor/python-venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "python-env: creating $venv" >&2
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import pytest, mypy, setuptools, grpc_tools, wheel" > /dev/null 2>&1; then
  echo "python-env: installing pytest, mypy, setuptools, wheel and grpcio-tools from PyPI" >&2
  "$venv/bin/python" -m pip install --quiet pytest mypy "setuptools>=64" wheel grpcio-tools >&2
fi
if [ "${FUSOR_PYTHON_TORCH:-0}" = 1 ] && ! "$venv/bin/python" -c "import torch, transformers" > /dev/null 2>&1; then
  echo "python-env: installing torch and transformers from PyPI (a 2.7 GB download)" >&2
  "$venv/bin/python" -m pip install --quiet torch transformers >&2
fi
echo "python-env: building and installing ./python" >&2
"$venv/bin/python" -m pip install --quiet --no-build-isolation "$root/python" >&2
echo "$venv/bin/python"
