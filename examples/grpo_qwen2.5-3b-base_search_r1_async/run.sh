#!/usr/bin/env bash
# GRPO with the Search-R1 tag protocol, trained asynchronously (verl's colocate_async: partial rollout, staleness
# bound 2, token-level TIS; docs/training.md, "Asynchronous training"). Start the retrieval server first
# (examples/retrieval_server_wiki18.sh),
# then: bash examples/grpo_qwen2.5-3b-base_search_r1_async/run.sh [hydra overrides...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export VERL_SEARCH_URL=${VERL_SEARCH_URL:-http://127.0.0.1:8000/retrieve}
# check-config first (fails in seconds, not after GPU allocation), then verl's main_ppo with the shipped
# tool / agent-loop YAMLs
verl-search train "$HERE/config.yaml" "$@"
