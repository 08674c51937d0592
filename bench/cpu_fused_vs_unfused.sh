#!/usr/bin/env bash
# Tuned fused kernel vs the strongest unfused baseline (OpenBLAS or oneDNN GEMMs) for examples/ chains on
# this CPU, measured in one run by one embedded worker (fresh database).
# Usage: bench/cpu_fused_vs_unfused.sh [budget] [example.fusor ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
budget="${1:-16}"
shift || true
examples=("$@")
if [ ${#examples[@]} -eq 0 ]; then
  examples=("$root"/examples/bert_base_attention.fusor "$root"/examples/gemm_chain.fusor
            "$root"/examples/bert_large_attention_f16.fusor "$root"/examples/bert_ffn_gelu.fusor
            "$root"/examples/conv_chain.fusor)
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$root/build/client/fusor" --db "$work/t.db" tune --budget "$budget" "${examples[@]}" > "$work/out.txt" 2> "$work/err.txt" || {
  cat "$work/err.txt"; exit 1; }
echo "| chain | fused (median) | unfused baseline (median) | speedup | best schedule | tuning time |"
echo "|---|---|---|---|---|---|"
awk '
  /^workload/ { name = $2 }
  /^answer/   { match($0, /in [0-9.]+ s/); t = substr($0, RSTART + 3, RLENGTH - 3) }
  /^schedule/ { sub(/^schedule +/, ""); sched = $0 }
  /^measured/ { fused = $2 " " $3 }
  /^baseline/ { base = $2 " " $3 }
  /^speedup/  { printf "| %s | %s | %s | %s | `%s` | %s |\n", name, fused, base, $2, sched, t }
' "$work/out.txt"
