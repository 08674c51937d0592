#!/usr/bin/env bash
# Offline checks of the deployment files and scripts: shellcheck on every
# shell script, yamllint on the YAML, and deploy/check_manifests.py on the
# Kubernetes manifests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mapfile -t scripts < <(find deploy bench tests .ci -type f \( -name '*.sh' -o -name '*.sbatch' -o -name run \) | sort)
shellcheck "${scripts[@]}"
yamllint -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable, truthy: {check-keys: false}}}' \
  deploy/k8s examples/zoo.yaml
python3 deploy/check_manifests.py deploy/k8s
echo "lint: ${#scripts[@]} scripts, $(find deploy/k8s -name '*.yaml' | wc -l) manifests clean"
