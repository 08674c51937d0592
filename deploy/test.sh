#!/usr/bin/env bash
# The whole test suite: build fusor if needed, then run every test (unit and
# e2e; gpu-labelled tests only where an NVIDIA GPU answers nvidia-smi), the
# offline lint of deploy/, the fuzz targets for 20 s each
# (FUSOR_FUZZ_SECONDS), the peer benchmark's short mode (every
# implementation validated against fusor's reference; no timing claim), and
# the Python package's type check (mypy) and tests (pytest), in the
# virtualenv of deploy/python-env.sh (the PyTorch tests are skipped unless
# PyTorch is there: --with-torch installs it and transformers first).
set -euo pipefail
torch=0
for arg in "$@"; do
  case "$arg" in
    --with-torch) torch=1 ;;
    *) echo "usage: $0 [--with-torch]" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/build.sh"
exclude=()
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi > /dev/null 2>&1; then
  exclude=(-LE gpu)
fi
(cd "$root/build" && ctest --output-on-failure -j 2 --timeout 900 "${exclude[@]}")
# The deployment files and scripts, checked offline.
"$root/deploy/lint.sh"
# The fuzz targets (clang's libFuzzer; tests/fuzz), each for a bounded time.
"$root/deploy/fuzz.sh"
# The peer benchmark keeps working: short mode, the model's picks, no tuning;
# on examples and on the chains `fusor extract` writes for real exports
# (masks with literal axes, heads in the export's layout, grouped K/V heads).
extracted="$(mktemp -d)"
for model in gpt2_torchscript_eager llama_torchscript_eager; do
  "$root/build/client/fusor" extract --dim batch=2 --dim seq=32 -o "$extracted/$model" \
    "$root/tests/common/zoo/exports/$model.onnx" > /dev/null
done
"$root/bench/peers/peers.sh" --short --model-only --fusor "$root/build/client/fusor" \
  "$root/examples/bert_base_attention.fusor" "$root/examples/gemm_chain.fusor" "$root/examples/conv1x1_chain.fusor" \
  "$extracted"/*/*.fusor
rm -rf "$extracted"
# The Python package: its type hints checked as installed (with the generated
# stubs), then its tests against the binaries just built.
python="$(FUSOR_PYTHON_TORCH=$torch "$root/deploy/python-env.sh" | tail -n 1)"
outside="$(mktemp -d)"  # mypy run from the source tree would check it instead of the installed package
(cd "$outside" && "$python" -m mypy --ignore-missing-imports --cache-dir=/dev/null -p fusor)
rmdir "$outside"
(cd "$root" && FUSOR_BUILD_DIR="$root/build" "$python" -m pytest -q -p no:cacheprovider "$root/python/tests")
