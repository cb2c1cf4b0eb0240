#!/usr/bin/env bash
# Serve wiki-18 (21M passages) with e5-base-v2 for training: starts the server in the background and
# returns once /health says ready (the server keeps running; stop it with: kill "$(cat "$PIDFILE")").
# Run it in the retrieval service's environment (pip install "verl-search[dense-gpu]"; docs/training.md).
# On a machine where faiss sees GPUs the flat index goes to all visible GPUs, sharded, in fp16 (64 GB in fp32
# fits no single GPU); add --cpu to keep it on the CPU. Extra arguments go to `verl-search serve`.
# Files: verl-search download wiki18 e5-index e5-model --out "$WIKI18"
set -euo pipefail
WIKI18=${WIKI18:-$HOME/data/wiki18}
PORT=${PORT:-8000}
LOG=${LOG:-retrieval_server.log}
PIDFILE=${PIDFILE:-retrieval_server.pid}
TIMEOUT=${TIMEOUT:-3600}   # seconds to wait for ready: reading a 64 GB index takes minutes
nohup verl-search serve --index "$WIKI18/e5_Flat.index" --corpus "$WIKI18/wiki-18.jsonl" \
    --encoder "$WIKI18/e5-base-v2" --port "$PORT" --max-batch-size 512 "$@" > "$LOG" 2>&1 &
SERVER=$!
echo "$SERVER" > "$PIDFILE"
deadline=$(( $(date +%s) + TIMEOUT ))
until curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"status":"ready"'; do
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "retrieval server exited before it was ready; see $LOG" >&2; tail -5 "$LOG" >&2; exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "retrieval server not ready after $TIMEOUT s; stopping it (see $LOG)" >&2; kill "$SERVER"; exit 1
    fi
    sleep 2
done
echo "retrieval server ready at http://127.0.0.1:$PORT/retrieve (pid $SERVER, in $PIDFILE; log $LOG)"
