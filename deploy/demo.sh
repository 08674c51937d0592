#!/usr/bin/env bash
# The main job: build fusor if needed, then tune the example attention and
# GEMM chains end to end on an embedded scheduler (database at
# ~/.local/share/fusor/tuning.db) with a local CPU worker, and print the
# results. Extra arguments go to `fusor tune` (e.g. --force, --budget 32).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/build.sh"
exec "$root/build/client/fusor" tune \
  "$root/examples/bert_base_attention.fusor" \
  "$root/examples/gemm_chain.fusor" "$@"
