#!/usr/bin/env bash
# What fusor derives from its inputs, written to one directory so that two
# builds can be compared byte for byte (`diff -r A B`): for a refactor that
# must not change behaviour. For every example, operator and bench chain:
# the schedule space at every pruning stage (explain, on this CPU and on an
# H100), the AMOS mappings, the model's pick as CPU and CUDA source
# (compile --model-only; on the CPU the schedule explain ranked first) and
# the unfused baseline; float64 references of the small chains; and the
# chains extracted from every model description and ONNX export (fixtures
# and fuzz corpus).
#   tests/tools/snapshot_outputs.sh OUT_DIR TARGET_DB [FUSOR_BINARY]
# This CPU's bandwidth and peak are calibrated anew on every run, and the
# model's ranking follows them: pass both snapshots the same TARGET_DB, in
# which the first run registers this CPU once (a one-candidate tune). What
# follows the calibration or the clock is dropped: the ranking's speed, a
# local pick's rank and predicted time.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:?usage: $0 OUT_DIR TARGET_DB [FUSOR_BINARY]}"
db="${2:?usage: $0 OUT_DIR TARGET_DB [FUSOR_BINARY]}"
fusor="${3:-$root/build/client/fusor}"
mkdir -p "$out"
if [ ! -f "$db" ]; then
  "$fusor" --db "$db" --max-spread 1e9 tune --budget 1 "$root/examples/gemm_chain.fusor" > /dev/null 2>&1
fi
cpu="$("$fusor" --db "$db" workers | awk '$4 ~ /^cpu-/ { print $4; exit }')"
[ -n "$cpu" ] || { echo "no CPU target registered in $db" >&2; exit 1; }
run() {  # run NAME CMD...: stdout, stderr and exit status into $out/NAME
  local name="$1"; shift
  "$@" > "$out/$name.out" 2> "$out/$name.err"
  echo "exit $?" >> "$out/$name.out"
}
for chain in "$root"/examples/*.fusor "$root"/examples/operators/*.fusor "$root"/bench/chains/*.fusor; do
  name="$(basename "$(dirname "$chain")")-$(basename "$chain" .fusor)"
  run "$name.explain-cpu" "$fusor" --db "$db" explain --top 20 --target "$cpu" "$chain"
  # The first row's schedule: the fields before its expression, which comes before t_mem ("144.4 us").
  pick="$(awk '/^top / { top = 1 } top && $1 == "1" {
    for (i = 3; i < NF; ++i) if ($(i + 1) ~ /^[nmu]?s$/ && $i ~ /^[0-9.]+$/) break
    s = $2; for (j = 3; j < i - 1; ++j) s = s " " $j; print s; exit }' "$out/$name.explain-cpu.out")"
  run "$name.explain-h100" "$fusor" explain --top 20 --target h100 "$chain"
  run "$name.mappings-h100" "$fusor" mappings --target h100 "$chain"
  run "$name.compile-local" "$fusor" compile --model-only --target local --schedule "$pick" -o "$out/$name.local" "$chain"
  run "$name.compile-h100" "$fusor" --backend cuda compile --model-only --target h100 -o "$out/$name.h100" "$chain"
  run "$name.unfused" "$fusor" compile --unfused openblas -o "$out/$name.unfused" "$chain"
done
# Partial fusions: a fused head, the rest unfused.
run split-t5_ffn "$fusor" compile --model-only --target local --schedule 'split after G: m=256 / f=128 / H(d=128) | unfused onednn' \
  -o "$out/split-t5_ffn" "$root/bench/chains/t5_ffn_relu_t512.fusor"
run split-bert_ffn "$fusor" compile --model-only --target local --schedule 'split after G: m=256 / f=128 / H(c=256) | unfused onednn' \
  -o "$out/split-bert_ffn" "$root/bench/chains/bert_ffn_const_t512.fusor"
for chain in "$root"/examples/gemm_chain.fusor "$root"/examples/conv1x1_chain.fusor "$root"/bench/chains/ref_gemm_chain.fusor \
             "$root"/examples/operators/*.fusor; do
  name="ref-$(basename "$chain" .fusor)"
  run "$name" "$fusor" reference -o "$out/$name" "$chain"
done
for model in "$root"/examples/models/*.json; do
  name="model-$(basename "$model" .json)"
  run "$name" "$fusor" extract -o "$out/$name" "$model"
done
for model in "$root"/tests/common/zoo/exports/*.onnx "$root"/tests/fuzz/corpus/onnx/*.onnx; do
  name="onnx-$(basename "$model" .onnx)"
  run "$name" "$fusor" extract --dim batch=8 --dim seq=128 -o "$out/$name" "$model"
done
find "$out" -name '*.json' \( -path '*.local/*' -o -path '*/split-*' \) -exec sed -i -E 's/"(predicted_s|rank)": *[0-9.e+-]+/"\1": X/' {} +
sed -i -E "s|$root|ROOT|g; s|$out|OUT|g; s/ranked in .*/ranked in X/; s/\((model rank [0-9]+|given[^,]*), predicted .*/(rank X, predicted X)/" \
  "$out"/*.out "$out"/*.err
