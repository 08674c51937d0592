#!/usr/bin/env bash
# Cache-hit Compile over loopback: starts a scheduler and one worker on
# 127.0.0.1 with a fresh database, tunes one workload once, then runs
# fusor-bench-cache-hit with 8 concurrent clients. Usage: bench/cache_hit.sh [seconds]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build"
seconds="${1:-10}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin/server/fusor-scheduler" --listen 127.0.0.1:0 --db "$work/t.db" --insecure --log-level warn > "$work/scheduler.log" 2>&1 &
for _ in $(seq 100); do grep -q "listening on port" "$work/scheduler.log" && break; sleep 0.1; done
port="$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/scheduler.log")"
"$bin/worker/fusor-worker" --scheduler "127.0.0.1:$port" --log-level warn > "$work/worker.log" 2>&1 &
for _ in $(seq 300); do "$bin/client/fusor" --server "127.0.0.1:$port" workers | grep -q alive && break; sleep 0.1; done
workload="$root/examples/bert_base_attention.fusor"
"$bin/client/fusor" --server "127.0.0.1:$port" tune "$workload" --budget 2 > /dev/null
"$bin/bench/fusor-bench-cache-hit" --server "127.0.0.1:$port" --workload "$workload" --clients 8 --seconds "$seconds"
