#!/usr/bin/env bash
# Cache-hit Compile over loopback, plaintext against TLS + tokens: for each
# setup, starts a scheduler and one worker on 127.0.0.1 with a fresh
# database on disk, tunes one workload once, then runs
# fusor-bench-cache-hit with 8 concurrent clients for SECONDS, first each
# client a thread of blocking calls, then on gRPC's callback API; then a
# sustained run (WINDOWS windows of SECONDS, mutual TLS + tokens) showing
# whether the rate holds, with the scheduler's peak RSS; then 64 clients
# (Compile and Lookup) while 8 tunes of other chains run.
# Usage: bench/cache_hit.sh [SECONDS] [WINDOWS]
# FUSOR_BENCH_SCHEDULER=PATH runs another scheduler build (a side-by-side
# comparison: alternate runs with and without it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build"
seconds="${1:-10}"
windows="${2:-6}"
work="$(mktemp -d "${FUSOR_BENCH_DIR:-$root/build}/cache-hit.XXXXXX")"  # on disk, not tmpfs
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
workload="$root/examples/bert_base_attention.fusor"
"$root/deploy/make-certs.sh" "$work/certs" > /dev/null

# setup DIR SECURITY: a scheduler (and worker) with SECURITY (plaintext,
# tls-tokens or mtls-tokens) on a fresh database in $work/DIR; sets $port,
# $scheduler_pid, $worker_pid and the client flags in $flags.
setup() {
  local dir="$work/$1" server_flags=() tls=() worker_token=() client_token=()
  mkdir -p "$dir"
  case "$2" in
    plaintext) server_flags=(--insecure) ;;
    tls-tokens | mtls-tokens)
      server_flags=(--tls-cert "$work/certs/scheduler.pem" --tls-key "$work/certs/scheduler.key")
      tls=(--tls-ca "$work/certs/ca.pem")
      if [ "$2" = mtls-tokens ]; then
        server_flags+=(--tls-client-ca "$work/certs/ca.pem")
        tls+=(--tls-cert "$work/certs/client.pem" --tls-key "$work/certs/client.key")
      fi
      local wt ct
      wt="$("$bin/client/fusor" --db "$dir/t.db" admin token create --role worker --name w 2> /dev/null)"
      ct="$("$bin/client/fusor" --db "$dir/t.db" admin token create --role client --name c 2> /dev/null)"
      worker_token=(--token "$wt")
      client_token=(--token "$ct")
      ;;
  esac
  flags=("${tls[@]}" "${client_token[@]}")
  "${FUSOR_BENCH_SCHEDULER:-$bin/server/fusor-scheduler}" --listen 127.0.0.1:0 --db "$dir/t.db" --log-level warn "${server_flags[@]}" \
    > "$dir/scheduler.log" 2>&1 &
  scheduler_pid=$!
  for _ in $(seq 100); do grep -q "listening on port" "$dir/scheduler.log" && break; sleep 0.1; done
  port="$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$dir/scheduler.log")"
  if [ -z "$port" ]; then
    cat "$dir/scheduler.log" >&2
    exit 1
  fi
  "$bin/worker/fusor-worker" --scheduler "127.0.0.1:$port" --log-level warn "${tls[@]}" "${worker_token[@]}" \
    > "$dir/worker.log" 2>&1 &
  worker_pid=$!
  for _ in $(seq 100); do
    "$bin/client/fusor" --server "127.0.0.1:$port" "${flags[@]}" workers 2> /dev/null | grep -q alive && break
    sleep 0.2
  done
  "$bin/client/fusor" --server "127.0.0.1:$port" "${flags[@]}" tune "$workload" --budget 2 > /dev/null
}

bench() {
  "$bin/bench/fusor-bench-cache-hit" --server "127.0.0.1:$port" --workload "$workload" "${flags[@]}" "$@"
}

header=--header
for security in plaintext tls-tokens mtls-tokens; do
  setup "$security" "$security"
  bench --clients 8 --seconds "$seconds" --label "$security" $header
  header=""
  bench --clients 8 --seconds "$seconds" --label "$security, callback clients" --callback
  kill "$worker_pid" "$scheduler_pid"
  wait "$worker_pid" "$scheduler_pid" || true
done

echo
echo "sustained, mutual TLS + tokens, database on disk ($windows x $seconds s):"
setup sustained mtls-tokens
header=--header
for i in $(seq "$windows"); do
  bench --clients 8 --seconds "$seconds" --label "window $i" $header
  header=""
done
echo "scheduler peak RSS: $(awk '/VmHWM/ {printf "%.0f MB", $2 / 1024}' "/proc/$scheduler_pid/status")"
kill "$worker_pid" "$scheduler_pid"
wait "$worker_pid" "$scheduler_pid" || true

echo
echo "64 clients (Compile and Lookup, plaintext) while 8 tunes of other chains run ($seconds s):"
setup busy plaintext
tunes=0
for chain in "$root"/examples/*.fusor "$root"/bench/chains/*.fusor; do
  [ "$tunes" -ge 8 ] && break
  [ "$chain" = "$workload" ] && continue
  "$bin/client/fusor" --server "127.0.0.1:$port" tune "$chain" --budget 64 --force > "$work/busy/tune-$tunes.log" 2>&1 &
  tunes=$((tunes + 1))
done
sleep 3  # the tasks have started: their spaces built, their jobs queued
bench --clients 64 --mixed --seconds "$seconds" --label "64 clients, $tunes tunes running" --header
echo "tasks running after the window: $(sqlite3 "$work/busy/t.db" "SELECT COUNT(*) FROM tasks WHERE state = 'running'" 2> /dev/null || echo "?")"
