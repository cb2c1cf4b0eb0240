#!/usr/bin/env bash
# Serve wiki-18 (21M passages) with e5-base-v2 for training, and wait until /health says ready.
# On a GPU machine with faiss-gpu the flat index goes to all visible GPUs, sharded, in fp16
# (64 GB in fp32 fits no single GPU). Files: verl-search download wiki18 e5-index e5-model --out "$WIKI18"
set -euo pipefail
WIKI18=${WIKI18:-$HOME/data/wiki18}
PORT=${PORT:-8000}
verl-search serve --index "$WIKI18/e5_Flat.index" --corpus "$WIKI18/wiki-18.jsonl" --encoder "$WIKI18/e5-base-v2" \
    --port "$PORT" --max-batch-size 512 > "${LOG:-retrieval_server.log}" 2>&1 &
SERVER=$!
until curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"status":"ready"'; do
    kill -0 "$SERVER" 2>/dev/null || { echo "retrieval server exited; see ${LOG:-retrieval_server.log}" >&2; exit 1; }
    sleep 5
done
echo "retrieval server ready at http://127.0.0.1:$PORT/retrieve (pid $SERVER)"
export VERL_SEARCH_URL="http://127.0.0.1:$PORT/retrieve"
wait "$SERVER"
