#!/usr/bin/env bash
# GRPO with the tool-call protocol. Start the retrieval server first (examples/retrieval_server_wiki18.sh),
# then: bash examples/grpo_qwen2.5-3b-instruct_tool/run.sh [hydra overrides...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export VERL_SEARCH_TOOL_CONFIG=${VERL_SEARCH_TOOL_CONFIG:-$(verl-search config-path tool)}
export VERL_SEARCH_URL=${VERL_SEARCH_URL:-http://127.0.0.1:8000/retrieve}
verl-search check-config "$HERE/config.yaml" "$@"          # fails in seconds, not after GPU allocation
python -m verl.trainer.main_ppo --config-path="$HERE" --config-name=config "$@"
