#!/usr/bin/env bash
# Kernel quality without a GPU: compiles the model's picks for sm_90 (and
# the other candidates the device check would measure) with NVRTC, and
# reports from ptxas and the SASS: main-loop instructions, shared-memory
# bytes, barriers and MUFU per HMMA, registers, spills, blocks per SM, the
# grid against the SMs (bench/gpu/sass_stats.py says how each is counted).
#
#   bench/gpu/static.sh [OUT] [CHAIN_FILE...]
#
# Defaults: OUT=/tmp/fusor-gpu-static, the examples and bench/gpu/chains.
# Needs the build (deploy/build.sh), NVRTC (the CUDA toolkit) and nvdisasm
# (`pip install nvidia-cuda-nvdisasm`, installed here when missing). Prints
# the model's pick of every chain, then the goals of issue 19 checked for
# f16 BERT-base attention; every candidate's row is in OUT/all.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-/tmp/fusor-gpu-static}"
shift || true
chains=("$@")
if [ ${#chains[@]} -eq 0 ]; then chains=("$root"/examples/*.fusor "$root"/bench/gpu/chains/*.fusor); fi
PYTHON=${PYTHON:-python3}
if [ -e "$out" ] && [ ! -d "$out/cubins" ]; then
  echo "static.sh: $out exists and is not an earlier output of this script; give another OUT" >&2
  exit 2
fi
if ! "$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import sass_stats; sys.exit(0 if sass_stats.find_nvdisasm() else 1)' \
    "$root/bench/gpu" 2>/dev/null; then
  "$PYTHON" -m pip install --quiet nvidia-cuda-nvdisasm >&2 || {
    echo "static.sh: nvdisasm is missing and pip could not install it: install nvidia-cuda-nvdisasm (pip) into" \
      "the Python that runs this script, or set NVDISASM to the binary" >&2
    exit 2
  }
fi
rm -rf "$out"
"$root/build/bench/fusor-bench-gpu-prep" --cubins "$out/cubins" "$out/prep" h200 8 "${chains[@]}" >&2
"$PYTHON" "$root/bench/gpu/sass_stats.py" "$out/cubins" --json "$out/all.json" > "$out/all.md"
echo "The model's pick per chain (candidate_0), sm_90, $(date -u +%F):"
"$PYTHON" "$root/bench/gpu/sass_stats.py" "$out/cubins" --label candidate_0 --json "$out/picks.json"
"$PYTHON" - "$out/picks.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
failed = 0
for r in rows:
    s = r["sass"]
    fills = r["grid"] >= r.get("sm_count", 132)
    print(f"{r['chain']}: grid {r['grid']} {'fills' if fills else 'does not fill'} the {r.get('sm_count', 132)} SMs")
    if r["chain"].startswith("bert_base_attention_f16"):
        goals = [("instr/HMMA <= 12", s["instr_per_hmma"] is not None and s["instr_per_hmma"] <= 12),
                 ("shared B/HMMA <= 128", s["smem_read_per_hmma"] is not None and s["smem_read_per_hmma"] <= 128),
                 ("no spills", r.get("spill_store_bytes", 0) == 0 and r.get("spill_load_bytes", 0) == 0),
                 ("grid >= SMs", fills)]
        for name, ok in goals:
            print(f"  {'met' if ok else 'MISSED'}: {name}")
            failed += not ok
sys.exit(1 if failed else 0)
EOF
