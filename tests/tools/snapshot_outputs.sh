#!/usr/bin/env bash
# What fusor derives from its inputs, written to one directory so that two
# builds can be compared byte for byte (`diff -r A B`): for a refactor that
# must not change behaviour. For every example, operator and bench chain:
# the schedule space at every pruning stage (explain, on this CPU and on an
# H100), the AMOS mappings, the model's first three picks as CPU source and
# its pick as CUDA source (compile --model-only), the unfused baseline and
# two partial fusions; float64 references of the small chains and of three
# attentions (masked, causal); the chains extracted from every model
# description and ONNX export (fixtures and fuzz corpus); the CLI's help,
# usage errors and exit codes; and the database's records exported,
# imported into a new database and exported again.
#   tests/tools/snapshot_outputs.sh OUT_DIR TARGET_DB [FUSOR_BINARY]
# This CPU's bandwidth and peak are calibrated anew on every run, and the
# model's ranking follows them: pass both snapshots the same TARGET_DB, in
# which the first run registers this CPU once (a one-candidate tune); the
# registration stays listed for 24 hours (the scheduler's
# --lost-worker-retention-hours), so take both snapshots within that. What
# follows the calibration or the clock is dropped: the ranking's speed, a
# local pick's rank and predicted time.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage="usage: $0 OUT_DIR TARGET_DB [FUSOR_BINARY]"
mkdir -p "${1:?$usage}"
out="$(cd "$1" && pwd)"
db="${2:?$usage}"
fusor="${3:-$root/build/client/fusor}"
for name in $(env | sed -n 's/^\(FUSOR_[A-Z0-9_]*\)=.*/\1/p'); do unset "$name"; done
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
  for rank in 1 2 3; do
    # Row `rank`'s schedule: the fields before its expression, which comes before t_mem ("144.4 us").
    pick="$(awk -v rank="$rank" '/^top / { top = 1 } top && $1 == rank {
      for (i = 3; i < NF; ++i) if ($(i + 1) ~ /^[nmu]?s$/ && $i ~ /^[0-9.]+$/) break
      s = $2; for (j = 3; j < i - 1; ++j) s = s " " $j; print s; exit }' "$out/$name.explain-cpu.out")"
    [ -n "$pick" ] || { echo "$name: no schedule ranked $rank in explain's output" >> "$out/problems.txt"; continue; }
    run "$name.compile-local$rank" "$fusor" compile --model-only --target local --schedule "$pick" \
      -o "$out/$name.local$rank" "$chain"
  done
  run "$name.explain-h100" "$fusor" explain --top 20 --target h100 "$chain"
  run "$name.mappings-h100" "$fusor" mappings --target h100 "$chain"
  run "$name.compile-h100" "$fusor" --backend cuda compile --model-only --target h100 -o "$out/$name.h100" "$chain"
  run "$name.unfused" "$fusor" compile --unfused openblas -o "$out/$name.unfused" "$chain"
done
# Partial fusions: a fused head, the rest unfused.
run split-t5_ffn "$fusor" compile --model-only --target local --schedule 'split after G: m=256 / f=128 / H(d=128) | unfused onednn' \
  -o "$out/split-t5_ffn" "$root/bench/chains/t5_ffn_relu_t512.fusor"
run split-bert_ffn "$fusor" compile --model-only --target local --schedule 'split after G: m=256 / f=128 / H(c=256) | unfused onednn' \
  -o "$out/split-bert_ffn" "$root/bench/chains/bert_ffn_const_t512.fusor"
for chain in "$root"/examples/gemm_chain.fusor "$root"/examples/conv1x1_chain.fusor "$root"/bench/chains/ref_gemm_chain.fusor \
             "$root"/examples/operators/*.fusor "$root"/examples/bert_base_attention.fusor \
             "$root"/examples/causal_attention.fusor "$root"/bench/chains/attention_h12_s512_mask.fusor; do
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
# The CLI itself: every subcommand's help, usage errors and their exit codes.
run help "$fusor" --help
for sub in $("$fusor" --help | awk '/^Subcommands:/ { on = 1; next } on && NF { print $1 }'); do
  run "help-$sub" "$fusor" "$sub" --help
done
for sub in "records export" "records import" "db backup" "admin token create" "admin token list" "admin token revoke"; do
  read -r -a words <<< "$sub"
  run "help-${sub// /-}" "$fusor" "${words[@]}" --help
done
run usage-none "$fusor"
run usage-no-file "$fusor" tune
run usage-schedule "$fusor" compile --schedule 'b=1 / - / -' "$root/examples/gemm_chain.fusor"
run usage-health "$fusor" health
run usage-detach "$fusor" sweep --detach "$root/examples/zoo.yaml"
run usage-missing "$fusor" explain "$out/no-such-file.fusor"
# Records: exported, imported into a new database, exported again.
run records-export "$fusor" --db "$db" records export -o "$out/records.jsonl"
rm -f "$out/import.db"
run records-import "$fusor" --db "$out/import.db" records import "$out/records.jsonl"
run records-reexport "$fusor" --db "$out/import.db" records export -o "$out/records-again.jsonl"
rm -f "$out/import.db"*
find "$out" -name '*.json' \( -path '*.local*/*' -o -path '*/split-*' \) -exec sed -i -E 's/"(predicted_s|rank)": *[0-9.e+-]+/"\1": X/' {} +
sed -i -E "s|$fusor|FUSOR|g; s|$root|ROOT|g; s|$out|OUT|g; s/ranked in .*/ranked in X/; s/\((model rank [0-9]+|given[^,]*), predicted .*/(rank X, predicted X)/" \
  "$out"/*.out "$out"/*.err
