#!/usr/bin/env bash
# Tuning time: `fusor tune --budget B` of each chain from an empty database (embedded scheduler and
# worker), ROUNDS times. With FUSOR_BENCH_OTHER set to another build's `fusor` binary, that build
# runs too, alternating with this one chain by chain, so that both see the same machine.
# Usage: bench/tune_time.sh [budget] [rounds] [chain.fusor ...]
# Prints one row per run, then each build's median per chain (seconds, as the answer reports them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
budget="${1:-16}"
rounds="${2:-2}"
shift 2 || shift $#
chains=("$@")
if [ ${#chains[@]} -eq 0 ]; then chains=("$root"/examples/*.fusor); fi
builds=("this=$root/build/client/fusor")
if [ -n "${FUSOR_BENCH_OTHER:-}" ]; then builds+=("other=$FUSOR_BENCH_OTHER"); fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "| chain | build | round | tuning time (s) | wall (s) |"
echo "|---|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for chain in "${chains[@]}"; do
    for b in "${builds[@]}"; do
      name="${b%%=*}" bin="${b#*=}"
      rm -f "$work"/t.db*
      start=$(date +%s.%N)
      "$bin" --db "$work/t.db" tune --budget "$budget" "$chain" > "$work/out.txt" 2> "$work/err.txt" || {
        cat "$work/err.txt" >&2; exit 1; }
      wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
      tuned=$(sed -n 's/^answer .* in \([0-9.]*\) s.*/\1/p' "$work/out.txt")
      printf "| %s | %s | %d | %s | %.1f |\n" "$(basename "$chain" .fusor)" "$name" "$r" "$tuned" "$wall" |
        tee -a "$work/rows.md"
    done
  done
done
echo
echo "| chain | build | median tuning time (s) |"
echo "|---|---|---|"
python3 - "$work/rows.md" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    runs.setdefault((cells[0], cells[1]), []).append(float(cells[3]))
for (chain, build), times in runs.items():
    print(f"| {chain} | {build} | {statistics.median(times):.1f} |")
EOF
