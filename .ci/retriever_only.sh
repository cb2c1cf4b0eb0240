#!/usr/bin/env bash
# The retrieval service on the base install alone: build a BM25 index, check it, serve it, answer a /retrieve.
# verl and torch must be absent, and a verl-side command must exit 2 naming the pip line.
# Usage: retriever_only.sh VENV CORPUS   (a JSONL file, or a shipped corpus by name: mini-wiki)
set -euo pipefail
venv=$1 corpus=$2
py="$venv/bin/python" cli="$venv/bin/verl-search"
tmp=$(mktemp -d)
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

for module in verl torch; do
  if "$py" -c "import $module" 2>/dev/null; then echo "retriever-only: $module imports in the base venv" >&2; exit 1; fi
done
"$cli" --version
"$cli" index build --corpus "$corpus" --out "$tmp/bm25" --retriever bm25 2>"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
# index check on the base install: gold-title hit@k of the index on the shipped questions
"$cli" index check "$tmp/bm25" --questions mini-wiki:test >"$tmp/check.md" 2>"$tmp/check.log" || { cat "$tmp/check.log"; exit 1; }
grep -q "^| bm25 | " "$tmp/check.md" || { echo "retriever-only: index check printed no bm25 row" >&2; cat "$tmp/check.md"; exit 1; }
port=$("$py" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$cli" serve --index "$tmp/bm25" --port "$port" --log-level warning 2>"$tmp/serve.log" &
server=$!
"$py" - "$port" <<'PY'
import sys, time
import httpx

base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 60
while True:
    try:
        if httpx.get(f"{base}/health", timeout=2).status_code == 200:
            break
    except httpx.TransportError:
        pass
    if time.monotonic() > deadline:
        sys.exit("retriever-only: /health never said ready within 60 s")
    time.sleep(0.2)
reply = httpx.post(f"{base}/retrieve", json={"queries": ["Christopher Nolan film director"], "topk": 3}, timeout=10)
reply.raise_for_status()
hits = reply.json()["result"][0]
if len(hits) != 3 or not any("Christopher Nolan" in h["document"]["contents"] for h in hits):
    sys.exit(f"retriever-only: unexpected /retrieve answer {reply.text[:300]}")
print(f"retriever-only: /retrieve answered {len(hits)} passages; top: {hits[0]['document']['contents'][:60]!r}")
PY
set +e
"$cli" eval --out "$tmp/eval" >"$tmp/eval.log" 2>&1
code=$?
set -e
if [ "$code" != 2 ] || ! grep -q 'pip install .*\[verl\]' "$tmp/eval.log"; then
  echo "retriever-only: verl-search eval exited $code without naming the [verl] extra:" >&2; cat "$tmp/eval.log" >&2; exit 1
fi
if grep -q Traceback "$tmp/eval.log"; then echo "retriever-only: eval printed a traceback" >&2; cat "$tmp/eval.log" >&2; exit 1; fi
echo "retriever-only: BM25 index built and served, /retrieve answered; verl and torch absent; eval exits 2 naming the extra"
