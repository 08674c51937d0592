#!/usr/bin/env bash
# The whole test suite: build fusor if needed, then run every test (unit and
# e2e; gpu-labelled tests only where an NVIDIA GPU answers nvidia-smi), the
# offline lint of deploy/, the fuzz targets for 20 s each
# (FUSOR_FUZZ_SECONDS), and the peer benchmark's short mode (every
# implementation validated against fusor's reference; no timing claim).
set -euo pipefail
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
# The peer benchmark keeps working: short mode, the model's picks, no tuning.
"$root/bench/peers/peers.sh" --short --model-only --fusor "$root/build/client/fusor" \
  "$root/examples/bert_base_attention.fusor" "$root/examples/gemm_chain.fusor" "$root/examples/conv1x1_chain.fusor"
