#!/usr/bin/env bash
# GRPO with the tool-call protocol on Qwen3-4B-Instruct-2507. Start the retrieval server first (examples/retrieval_server_wiki18.sh),
# then: bash examples/grpo_qwen3-4b-instruct_tool/run.sh [hydra overrides...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export VERL_SEARCH_URL=${VERL_SEARCH_URL:-http://127.0.0.1:8000/retrieve}
# check-config first (fails in seconds, not after GPU allocation), then verl's main_ppo with the tool YAML of
# tool_configs/ (search and page access: actor_rollout_ref.rollout.multi_turn.tool_config_path=$PWD/tool_configs/
# access_tool_config.yaml) and the shipped agent-loop YAML; add --cpu to try the same recipe on a laptop first (README, "Train on the CPU"; docs/cpu-engine.md)
verl-search train "$HERE/config.yaml" "$@"
