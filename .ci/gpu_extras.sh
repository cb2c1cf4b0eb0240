#!/usr/bin/env bash
# The GPU extras resolve, without a GPU and without downloading GPU wheels: for each extra, pip (current, in a
# throwaway venv) resolves the built wheel with that extra (`--dry-run --ignore-installed --report`), reading
# only each wheel's metadata (`fast-deps`: HTTP range requests, for indexes that serve no PEP 658 metadata),
# and check_install_report.py checks the picked versions against every pin on the way (verl==0.9.1, verl's
# transformers range, the engine's own pins) and that the engine is in the set. Each extra's time is printed.
# Usage: gpu_extras.sh WHEEL
set -euo pipefail
wheel=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
python -m venv "$work/venv"
py="$work/venv/bin/python"
# fast-deps (metadata through HTTP range requests) is a pip 26 feature flag
"$py" -m pip install -q -U "pip>=26.3,<27" packaging

# extra -> what must be in its set (name, or name==version)
declare -A expect=(
  [vllm]="verl==0.9.1 vllm torch transformers"
  [sglang]="verl==0.9.1 sglang torch transformers"
  [megatron]="verl==0.9.1 megatron-core mbridge transformer-engine vllm torch"
  [dense-gpu]="faiss-gpu-cu12 sentence-transformers torch"
)
for extra in vllm sglang megatron dense-gpu; do
  t0=$(date +%s)
  if ! "$py" -m pip install --dry-run --ignore-installed --use-feature=fast-deps --report "$work/$extra.json" \
      "$wheel[$extra]" >"$work/$extra.log" 2>&1; then
    grep -v "^WARNING: Location" "$work/$extra.log" | tail -30 >&2
    echo "gpu-extras: [$extra] does not resolve" >&2
    exit 1
  fi
  # metadata only: a downloaded wheel of 100 MB or more (torch, vllm, CUDA libraries) fails the check
  if grep -E "Downloading .*\.whl \(([0-9]{3,}(\.[0-9]+)? MB|[0-9.]+ GB)\)" "$work/$extra.log" >&2; then
    echo "gpu-extras: [$extra] downloaded GPU wheels instead of their metadata" >&2
    exit 1
  fi
  # shellcheck disable=SC2086
  "$py" "$here/check_install_report.py" "$work/$extra.json" "$extra" ${expect[$extra]}
  echo "gpu-extras: [$extra] resolved and checked in $(( $(date +%s) - t0 )) s"
done
