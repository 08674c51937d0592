#!/usr/bin/env bash
# Offline checks of the deployment files and scripts: shellcheck on every
# shell script, yamllint on the YAML, deploy/check_manifests.py on the
# Kubernetes manifests, and the systemd units: their exposure
# (`systemd-analyze security --offline`: at most 4.0 for the scheduler, 5.0
# for the workers) and, installed by `cmake --install` under a scratch
# prefix (when ./build is built), `systemd-analyze verify`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mapfile -t scripts < <(find deploy bench tests .ci -type f \( -name '*.sh' -o -name '*.sbatch' -o -name run \) | sort)
shellcheck "${scripts[@]}"
yamllint -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable, truthy: {check-keys: false}}}' \
  deploy/k8s deploy/config examples/zoo.yaml
python3 deploy/check_manifests.py deploy/k8s
units=(deploy/systemd/*.service)
for unit in "${units[@]}"; do
  case "$unit" in
    */fusor-scheduler.service) limit=40 ;;
    *) limit=50 ;;
  esac
  if ! report="$(systemd-analyze security --offline=true --threshold="$limit" "$unit" 2>&1)"; then
    echo "$report" >&2
    echo "lint: $unit is more exposed than $((limit / 10)).0" >&2
    exit 1
  fi
done
if [ -x build/client/fusor ]; then
  staged="$(mktemp -d)"
  trap 'rm -rf "$staged"' EXIT
  cmake --install build --prefix "$staged" > /dev/null
  for unit in "${units[@]}"; do
    # Any complaint fails: a program that is not there, an unknown key or value.
    report="$(systemd-analyze verify "$staged/lib/systemd/system/$(basename "$unit")" 2>&1)" || true
    if [ -n "$report" ]; then
      echo "$report" >&2
      echo "lint: systemd-analyze verify $unit (as installed) complains" >&2
      exit 1
    fi
  done
fi
echo "lint: ${#scripts[@]} scripts, $(find deploy/k8s -name '*.yaml' | wc -l) manifests, ${#units[@]} systemd units clean"
