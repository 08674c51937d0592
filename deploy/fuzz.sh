#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang with ASan and UBSan) and
# runs each for FUSOR_FUZZ_SECONDS (default 20) from its seed corpus, with
# its dictionary (tests/fuzz/dict), after replaying every kept regression
# input. FUSOR_FUZZ_RUNS=N runs each for N executions instead (the long runs
# recorded in bench/RESULTS.md). New corpus entries go to a scratch copy; a
# crash stops the script with its input saved under build-fuzz/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${FUSOR_FUZZ_SECONDS:-20}"
runs="${FUSOR_FUZZ_RUNS:-}"
build="$root/build-fuzz"
cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None > /dev/null
ninja -C "$build" -j 2
for target in chain_text proto_json onnx; do
  fuzzer="$build/fuzz_$target"
  regressions="$root/tests/fuzz/regressions/$target"
  if [ -d "$regressions" ] && [ -n "$(find "$regressions" -type f)" ]; then
    echo "fuzz: $target: replaying $(find "$regressions" -type f | wc -l) regression inputs"
    "$fuzzer" "$regressions"/* > "$build/$target-regressions.log" 2>&1 ||
      { tail -40 "$build/$target-regressions.log"; exit 1; }
  fi
  scratch="$build/corpus-$target"
  rm -rf "$scratch"
  mkdir -p "$scratch"
  cp "$root/tests/fuzz/corpus/$target"/* "$scratch/"
  limit=(-max_total_time="$seconds")
  [ -n "$runs" ] && limit=(-runs="$runs")
  dict=()
  [ -f "$root/tests/fuzz/dict/$target.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$target.dict")
  echo "fuzz: $target: ${runs:-${seconds} s} ${runs:+runs }from $(find "$scratch" -type f | wc -l) seeds"
  (cd "$build" && "$fuzzer" "${limit[@]}" "${dict[@]}" -timeout=25 -rss_limit_mb=4096 -max_len=65536 -len_control=0 \
      -print_final_stats=1 "$scratch" > "$build/$target.log" 2>&1) ||
    { tail -60 "$build/$target.log"; echo "fuzz: $target found a crash; its input is in $build"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/$target.log" | tr '\n' ' '
  echo
done
