"""FlashRAG's `POST /batch_search` against our `POST /retrieve` on one server, same queries (prints numbers; not a test).

One `verl-search serve` child process (BM25 over the mini corpus by default, cache off) answers both routes through
the same micro-batcher. `wrk` (1 thread, `--clients` connections) sends one real question per request, top 5 (the
ReSearch rollout's request), first to one route and then to the other, for `--rounds` alternating rounds; printed
per round: queries/s of each route and their ratio, then the median ratio. The routes differ only in their request
and response shapes (`verl_search.server.flashrag`), so the ratio is the cost of that translation.

    python benchmarks/bench_flashrag_routes.py --clients 256 --seconds 10 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...
from bench_retrieval_server import LUA, run_wrk, wait_until_idle

from verl_search.datasets import read_questions
from verl_search.server.local import SubprocessServer

ROUTES = {"/retrieve": lambda q: {"queries": [q], "topk": 5}, "/batch_search": lambda q: {"query": [q], "top_n": 5}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--retriever", choices=["bm25", "dense"], default="bm25")
    parser.add_argument("--clients", type=int, default=256, help="wrk connections")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each route's run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (route order swaps each round)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    index = index_folder(Path(args.index_root), args.retriever, args.corpus, args.encoder)
    questions = [row["question"] for row in read_questions(args.qa)]
    folder = Path(tempfile.mkdtemp(prefix="bench_flashrag_"))
    files = {}
    for route, body in ROUTES.items():
        scripts = folder / f"{route.strip('/')}.lua"
        scripts.write_text(LUA.replace('"/retrieve"', f'"{route}"'))
        bodies = folder / f"{route.strip('/')}.jsonl"
        bodies.write_text("".join(json.dumps(body(questions[n % len(questions)])) + "\n" for n in range(4000)))
        files[route] = (scripts, bodies)
    print(f"index {index.name}, {args.clients} clients, {args.seconds:.0f} s per route and round, one query per request")
    ratios = []
    with SubprocessServer(["--index", str(index)]) as server:
        run_wrk(server.url, *files["/retrieve"], clients=args.clients, seconds=3)  # warm-up
        wait_until_idle([server])
        for round_ in range(args.rounds):
            order = list(ROUTES) if round_ % 2 == 0 else list(reversed(ROUTES))
            qps = {}
            for route in order:
                result = run_wrk(server.url, *files[route], clients=args.clients, seconds=args.seconds)
                wait_until_idle([server])
                if result["errors"]:
                    print(f"  {route}: {result['errors']} errors")
                qps[route] = result["requests"] / (result["duration_us"] / 1e6)
            ratios.append(qps["/batch_search"] / qps["/retrieve"])
            print(f"round {round_ + 1}: /retrieve {qps['/retrieve']:.0f} q/s, /batch_search {qps['/batch_search']:.0f} "
                  f"q/s, ratio {ratios[-1]:.3f}")
    print(f"median ratio /batch_search / /retrieve: {statistics.median(ratios):.3f}")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
