#!/usr/bin/env bash
# The GPU device check: run on a machine with an NVIDIA GPU, CUDA and
# PyTorch (none of fusor's Debian libraries are needed there).
#
#   Here (no GPU):  build/bench/fusor-bench-gpu-prep build/gpu-prep h200 8 examples/*.fusor
#   On the GPU:     bench/gpu/run.sh build/gpu-prep [OUT]
#
# Through the device tool: run with carry ["build/gpu-prep"] and the
# command `bench/gpu/run.sh build/gpu-prep "$OUT"` (the log comes back in
# $OUT/log.txt). Not yet run on a GPU: none was lent so far.
#
# It builds the runner (fusor's CUDA backend in plain C++ over the driver,
# NVRTC and cuBLAS), measures every prepared candidate and the unfused
# cuBLAS baseline (validated against the float64 reference), times the
# PyTorch peers, keeps the full log in OUT/log.txt and prints the table
# last.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREP=${1:?usage: bench/gpu/run.sh PREP_DIR [OUT]}
OUT=${2:-${OUT:-/tmp/fusor-gpu-check}}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: >"$LOG"
echo "== building the runner ($(date -u +%FT%TZ))" | tee -a "$LOG"
${CXX:-g++} -O2 -std=c++17 -I. -I"$CUDA_HOME/include" bench/gpu/runner.cc worker/cuda/gpu_runtime.cc \
  common/codegen/cuda/nvrtc.cc common/codegen/cuda/program.cc -ldl -o "$OUT/fusor-gpu-check" 2>&1 | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG" || true
echo "== fusor: candidates and unfused baselines" | tee -a "$LOG"
status=0
CUDA_HOME=$CUDA_HOME "$OUT/fusor-gpu-check" "$PREP" common/codegen/cuda/device/fusor_device.h "${SECONDS_PER_KERNEL:-0.2}" \
  2>&1 | tee -a "$LOG" || status=$?
echo "== PyTorch peers" | tee -a "$LOG"
chains=()
for d in "$PREP"/*/; do
  name=$(basename "$d")
  for f in examples/*.fusor; do
    grep -q "^chain $name\$" "$f" && chains+=("$f")
  done
done
python3 bench/gpu/torch_peers.py "${chains[@]}" 2>&1 | tee -a "$LOG" || status=$?
echo "== summary" | tee -a "$LOG"
python3 bench/gpu/table.py "$LOG" | tee -a "$LOG"
exit $status
