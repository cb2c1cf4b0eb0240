#!/usr/bin/env bash
# PPO with the Search-R1 tag protocol. Start the retrieval server first (examples/retrieval_server_wiki18.sh),
# then: bash examples/ppo_qwen2.5-3b-base_search_r1/run.sh [hydra overrides...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export VERL_SEARCH_AGENT_LOOPS=${VERL_SEARCH_AGENT_LOOPS:-$(verl-search config-path agent-loop)}
export VERL_SEARCH_URL=${VERL_SEARCH_URL:-http://127.0.0.1:8000/retrieve}
verl-search check-config "$HERE/config.yaml" "$@"
python -m verl.trainer.main_ppo --config-path="$HERE" --config-name=config "$@"
