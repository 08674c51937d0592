#!/usr/bin/env bash
# Compiling ahead on a CPU worker: `fusor-scheduler` and `fusor-worker --compile-ahead N` on
# loopback, N = 0 (each job compiled just before it is measured) and 3 (the round compiled
# together first), alternating, ROUNDS times; per run the tuning time of 16 candidates and, from
# the database, the candidates' median spread and how many came out noisy.
# Usage: bench/compile_ahead.sh [rounds] [chain.fusor ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${1:-2}"
shift || true
chains=("$@")
if [ ${#chains[@]} -eq 0 ]; then chains=("$root/examples/gemm_chain.fusor" "$root/examples/bert_base_attention.fusor"); fi
port=7791
echo "| chain | compile ahead | round | tuning time (s) | median spread | noisy |"
echo "|---|---|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for ahead in 0 3; do
    for chain in "${chains[@]}"; do
      work="$(mktemp -d)"
      "$root/build/server/fusor-scheduler" --listen "127.0.0.1:$port" --db "$work/t.db" --insecure > "$work/s.log" 2>&1 &
      scheduler=$!
      "$root/build/worker/fusor-worker" --scheduler "127.0.0.1:$port" --backend cpu --compile-ahead "$ahead" \
        > "$work/w.log" 2>&1 &
      worker=$!
      for _ in $(seq 150); do grep -q "registered as" "$work/w.log" && break; sleep 0.2; done
      "$root/build/client/fusor" --server "127.0.0.1:$port" tune --budget 16 "$chain" > "$work/out.txt" 2>&1 || {
        cat "$work/out.txt" >&2; kill "$worker" "$scheduler"; exit 1; }
      tuned=$(sed -n 's/^answer .* in \([0-9.]*\) s.*/\1/p' "$work/out.txt")
      kill "$worker"; wait "$worker" 2>/dev/null || true
      kill "$scheduler"; wait "$scheduler" 2>/dev/null || true
      "$root/build/client/fusor" --db "$work/t.db" records export | python3 -c '
import json, statistics, sys
spreads, noisy = [], 0
for line in sys.stdin:
    m = json.loads(line)
    if m["kind"] == "candidate":
        spreads.append(m.get("spread", 0))
        noisy += m["status"] == "noisy"
print(f"| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {statistics.median(spreads):.2f} | {noisy} of {len(spreads)} |")
' "$(basename "$chain" .fusor)" "$ahead" "$r" "$tuned"
      rm -rf "$work"
    done
  done
done
