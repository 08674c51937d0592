#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang with ASan and UBSan) and
# runs each for FUSOR_FUZZ_SECONDS (default 20) from its seed corpus, with
# its dictionary (tests/fuzz/dict), after replaying every kept regression
# input. New corpus entries go to a scratch copy; a crash stops the script
# with its input saved under build-fuzz/.
# Long runs (recorded in bench/RESULTS.md):
#   FUSOR_FUZZ_RUNS=N     N executions per target instead of a time limit
#   FUSOR_FUZZ_JOBS=J     J fuzzing processes per target sharing one corpus
#                         (N/J executions each)
#   FUSOR_FUZZ_TARGETS=.. which targets, in order (default: all three)
# A long run turns off the entropic schedule, which halves the execution
# rate on a corpus whose coverage has settled. ASan keeps no allocation
# stacks and a small quarantine (about 1.5x the rate; ASAN_OPTIONS overrides):
# replay a crash's input for the full report.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${FUSOR_FUZZ_SECONDS:-20}"
runs="${FUSOR_FUZZ_RUNS:-}"
jobs="${FUSOR_FUZZ_JOBS:-1}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=0:quarantine_size_mb=16}"
build="$root/build-fuzz"
cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None > /dev/null
ninja -C "$build" -j 2
for target in ${FUSOR_FUZZ_TARGETS:-chain_text proto_json onnx}; do
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
  [ -n "$runs" ] && limit=(-runs=$((runs / jobs)) -entropic=0)
  [ "$jobs" -gt 1 ] && limit+=(-jobs="$jobs" -workers="$jobs")
  dict=()
  [ -f "$root/tests/fuzz/dict/$target.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$target.dict")
  echo "fuzz: $target: ${runs:-${seconds} s} ${runs:+runs }in $jobs process(es) from $(find "$scratch" -type f | wc -l) seeds"
  logs="$build/logs-$target"
  rm -rf "$logs"
  mkdir -p "$logs"
  (cd "$logs" && "$fuzzer" "${limit[@]}" "${dict[@]}" -timeout=25 -rss_limit_mb=4096 -max_len=65536 -len_control=0 \
      -print_final_stats=1 "$scratch" > "$logs/fuzz.log" 2>&1) ||
    { tail -60 "$logs/fuzz.log"; echo "fuzz: $target found a crash; its input is in $logs"; exit 1; }
  # With jobs, fuzz.log repeats each job's own log (fuzz-J.log).
  stats=("$logs/fuzz.log")
  [ "$jobs" -gt 1 ] && stats=("$logs"/fuzz-*.log)
  cat "${stats[@]}" | awk -v t="$target" '/stat::number_of_executed_units/ {runs += $2}
      /stat::new_units_added/ {added += $2} END {print "fuzz: " t ": " runs " executions, " added " new inputs"}'
done
