"""What the HTTP layer of the retrieval server costs per request, without the retriever (prints numbers; not a test).

The real app (`create_app`: uvicorn, FastAPI, the route, the micro-batcher, orjson) serves an
in-memory retriever that answers at once with 3 real passages of the mini corpus, so all the time
left is the server's own: parsing, validation, the batcher hand-off, the response. `wrk` (1
thread, the cycling Lua script of `bench_retrieval_server.py`) drives it with single-query
requests of the real questions. Printed per level: requests/s and the server's CPU milliseconds
per request (this process's CPU time over the level; the uvicorn thread and the batcher thread).

On a small machine that CPU is taken from the encoder's threads (docs/benchmarks/http-overhead.md).
Compare two versions of the server in one shell, alternating:

    for i in 1 2 3; do for src in /path/to/old/src src; do
        PYTHONPATH=$src python benchmarks/bench_http_overhead.py --seconds 5; done; done
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench_retrieval_server import LUA, run_wrk, write_bodies

import verl_search
from verl_search.datasets import read_questions, resolve_corpus
from verl_search.retrieval.base import Hit
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.server.app import create_app, index_service
from verl_search.server.local import ThreadServer


class InstantRetriever:
    """Answers every query at once with the same `topk` hits (the first passages of a corpus)."""

    kind = "instant"

    def __init__(self, corpus: JsonlCorpus, size: int = 16):
        self.hits = [Hit(passage=corpus.get(row), score=1.0) for row in range(size)]
        self.num_passages = size

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        return [self.hits[:topk] for _ in queries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="mini-wiki", help="JSONL corpus, or a shipped one by name")
    parser.add_argument("--qa", default="mini-wiki", help="questions: JSONL file or DATASET[:SPLIT]")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each level")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 256], help="connections per level")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")

    questions = [row["question"] for row in read_questions(args.qa)]
    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    script = work / "cycle.lua"
    script.write_text(LUA)
    bodies = write_bodies(work, questions, 1)
    print(f"# HTTP overhead of verl_search from {Path(verl_search.__file__).parent}: {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    with ThreadServer(create_app(index_service(InstantRetriever(JsonlCorpus(resolve_corpus(args.corpus)))))) as server:
        run_wrk(server.url, script, bodies, 4, 1)  # warm-up
        for clients in args.clients:
            before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            result = run_wrk(server.url, script, bodies, clients, args.seconds)
            after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            print(f"{clients:>4} clients: {result['requests'] / (result['duration_us'] / 1e6):>8.0f} requests/s, "
                  f"server CPU {1000 * cpu / max(result['requests'], 1):.3f} ms/request "
                  f"({cpu / wall:.2f} cores), errors {result['errors']}")


if __name__ == "__main__":
    main()
