#!/usr/bin/env bash
# The GPU device check: run on a machine with an NVIDIA GPU and either the
# CUDA toolkit or only the driver and a pip PyTorch (NVRTC and cuBLAS are
# then taken from pip's nvidia packages). None of fusor's Debian libraries
# are needed there.
#
#   Here (no GPU):  build/bench/fusor-bench-gpu-prep build/gpu-prep h200 8 \
#                     examples/*.fusor bench/gpu/chains/*.fusor
#   On the GPU:     bench/gpu/run.sh build/gpu-prep [OUT]
#
# Through the device tool: carry ["build/gpu-prep"] and run
# `bench/gpu/run.sh build/gpu-prep "$OUT"`; the log comes back in
# $OUT/log.txt. At most about 5.5 minutes: DEADLINE_S (default 200) bounds
# the measuring, ITEM_TIMEOUT_S (default 30) each kernel.
#
# It builds the runner (fusor's CUDA backend in plain C++ over the driver,
# NVRTC and cuBLAS, all loaded at run time), measures every prepared
# candidate and the unfused cuBLAS baseline in child processes (a fault or
# a hang costs one row), validated against the float64 reference, times
# the PyTorch peers, keeps the full log in OUT/log.txt and prints the table
# last.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREP=${1:?usage: bench/gpu/run.sh PREP_DIR [OUT]}
OUT=${2:-${OUT:-/tmp/fusor-gpu-check}}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "== $* ($(date -u +%FT%TZ))" | tee -a "$LOG"; }

# NVRTC and cuBLAS: a toolkit's, else those of pip's nvidia packages.
libdirs=$("$PYTHON" - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = [p for p in sys.path + site.getsitepackages() if os.path.isdir(os.path.join(p, "nvidia"))]
dirs = {os.path.dirname(f) for r in roots for lib in ("libnvrtc.so*", "libcublas.so*")
        for f in glob.glob(os.path.join(r, "nvidia", "*", "lib", lib))}
print(":".join(sorted(dirs)))
EOF
)
for d in ${CUDA_HOME:-} /usr/local/cuda; do
  [ -d "$d/lib64" ] && libdirs="$libdirs:$d/lib64"
done
export LD_LIBRARY_PATH="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "libraries from: $LD_LIBRARY_PATH" >>"$LOG"

say "building the runner"
${CXX:-g++} -O2 -std=c++17 -I. bench/gpu/runner.cc bench/gpu/supervise.cc worker/cuda/gpu_runtime.cc \
  common/codegen/cuda/nvrtc.cc common/codegen/cuda/program.cc -ldl -lpthread -o "$OUT/fusor-gpu-check" 2>&1 |
  tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG" || true

say "fusor: candidates and unfused baselines"
status=0
"$OUT/fusor-gpu-check" "$PREP" common/codegen/cuda/device/fusor_device.h --seconds "${SECONDS_PER_KERNEL:-0.2}" \
  --deadline "${DEADLINE_S:-200}" --item-timeout "${ITEM_TIMEOUT_S:-30}" 2>&1 | tee -a "$LOG" || status=$?

say "PyTorch peers"
chains=()
for d in "$PREP"/*/; do
  name=$(basename "$d")
  for f in examples/*.fusor bench/gpu/chains/*.fusor; do
    if grep -qxF "chain $name" "$f"; then chains+=("$f"); fi
  done
done
if [ ${#chains[@]} -gt 0 ]; then
  # The runner's status (3: no device) is kept over the peers'.
  peers=0
  timeout 90 "$PYTHON" bench/gpu/torch_peers.py "${chains[@]}" 2>&1 | tee -a "$LOG" || peers=$?
  [ "$status" -ne 0 ] || status=$peers
fi

say "summary"
"$PYTHON" bench/gpu/table.py "$LOG" | tee -a "$LOG"
exit $status
