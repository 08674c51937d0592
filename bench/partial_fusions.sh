#!/usr/bin/env bash
# Partial fusions against one fused kernel and the unfused chain: tunes each chain on a fresh database
# (one embedded CPU worker, default budget) and prints, per task, the best single fused kernel, the best
# split (the chain in two parts, each fused or unfused), the confirmation of the best and the unfused
# baseline timed beside it, and the answer. Medians in ms. Needs the sqlite3 command.
# Usage: bench/partial_fusions.sh [chain.fusor ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chains=("$@")
if [ ${#chains[@]} -eq 0 ]; then
  chains=("$root"/examples/bert_ffn_gelu.fusor "$root"/bench/chains/bert_ffn_const_t128.fusor
          "$root"/bench/chains/bert_ffn_const_t512.fusor "$root"/examples/conv_chain.fusor
          "$root"/bench/chains/conv_chain_const.fusor "$root"/examples/conv1x1_chain.fusor
          "$root"/examples/gemm_chain.fusor)
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "| chain | one fused kernel | best split | its kind | confirmation (of) | unfused beside it | answer |"
echo "|---|---:|---:|---|---:|---:|---|"
best="select min(m.median_s) * 1e3 from measurements m join candidates c on c.id = m.candidate_id
      where m.task_id = t.id and m.kind = 'candidate' and m.status = 'ok'"
ms() { echo "case when ($1) is null then '–' else printf('%.3f', ($1)) end"; }  # no trusted one: a dash
for i in "${!chains[@]}"; do
  db="$work/$i.db"  # a fresh database per chain: no learned model from the chains before it
  "$root/build/client/fusor" --db "$db" tune "${chains[$i]}" > /dev/null 2> "$work/err.txt" || {
    cat "$work/err.txt"; exit 1; }
  sqlite3 -separator ' | ' "$db" "
select '| ' || w.name,
  $(ms "$best and c.schedule not like 'split%'"),
  $(ms "$best and c.schedule like 'split%'"),
  coalesce((select case when c.schedule like '%: unfused%' then 'unfused, then fused'
                        when c.schedule like '%| unfused%' then 'fused, then unfused' else 'fused, then fused' end
     from measurements m join candidates c on c.id = m.candidate_id
     where m.task_id = t.id and m.kind = 'candidate' and m.status = 'ok' and c.schedule like 'split%'
     order by m.median_s limit 1), '–'),
  coalesce((select printf('%.3f (%s)', m.median_s * 1e3, case when c.schedule like 'split%' then 'split' else 'fused' end)
     from measurements m join candidates c on c.id = m.candidate_id
     where m.task_id = t.id and m.kind = 'confirm' and m.status = 'ok' order by m.id desc limit 1), '–'),
  coalesce((select printf('%.3f', json_extract(m.resources_json, '$.beside.median_s') * 1e3) from measurements m
     where m.task_id = t.id and m.kind = 'confirm' and m.status = 'ok' order by m.id desc limit 1), '–'),
  (select case when c.schedule like 'unfused%' then 'unfused' when c.schedule like 'split%' then 'split'
               else 'fused' end || ' |'
     from best b join candidates c on c.id = b.candidate_id where b.workload_key = t.workload_key)
from tasks t join workloads w on w.key = t.workload_key order by t.created_ms"
done
