#!/usr/bin/env bash
# The peer benchmark on every example chain and on every distinct chain
# `fusor extract` finds in the committed ONNX fixtures (BERT, GPT-2, T5, ViT
# and LLaMA, TorchScript exports, batch 1) at the given sequence lengths:
#   bench/peers/extracted.sh [--seqs "128 512"] [peers.py arguments...]
# Each model's weights are constants (initializers), as peers.py gives them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seqs="128 512"
if [ "${1:-}" = "--seqs" ]; then
  seqs="$2"
  shift 2
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
chains=("$root"/examples/*.fusor)
for seq in $seqs; do
  for model in bert gpt2 t5 vit llama; do
    # ViT's sequence is its image's patches: one length only.
    if [ "$model" = vit ] && [ "$seq" != "${seqs%% *}" ]; then continue; fi
    out="$dir/${model}_s$seq"
    "$root/build/client/fusor" extract --dim batch=1 --dim "seq=$seq" -o "$out" \
      "$root/tests/common/zoo/exports/${model}_torchscript_eager.onnx" > /dev/null
    for f in "$out"/*.fusor; do
      # One name per model and length, so that the tables say which chain is which.
      sed -i "s/^chain \(.*\)$/chain ${model}_s${seq}_\1/" "$f"
      chains+=("$f")
    done
  done
done
python="$("$root/deploy/peers-env.sh" --torch | tail -n 1)"
"$python" "$root/bench/peers/peers.py" "$@" "${chains[@]}"
