"""SearchTool overhead benchmark (prints numbers; not a test).

Serves the BM25 index of the mini corpus (`verl-search serve`, a child process) and fires rounds
of 1, 16 and 256 concurrent `SearchTool.execute` calls from one event loop, as one agent-loop worker does
during a rollout step. Prints calls/s, errors, and the tool's own overhead per call: the tool's
latency minus the server's time for that request (`Server-Timing`), i.e. HTTP, JSON and
formatting on the client side, p50 and p99 in milliseconds, and the tool process's CPU time per
call. On a 2-core machine client and server share the cores, so under 256-way concurrency the
latency is mostly queueing on both sides; CPU per call is the tool's own cost.

    python benchmarks/bench_search_tool.py --concurrency 1,16,256
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import numpy as np

from verl_search.datasets import read_questions
from verl_search.server.local import SubprocessServer
from verl_search.tools.search_tool import SearchTool

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...


async def one_call(tool: SearchTool, query: str) -> dict:
    instance_id, _ = await tool.create(create_kwargs={})
    started = time.perf_counter()
    _, _, metrics = await tool.execute(instance_id, {"query_list": [query]})
    metrics["wall_s"] = time.perf_counter() - started
    await tool.release(instance_id)
    return metrics


async def run(url: str, questions: list[str], concurrency: int, rounds: int) -> None:
    tool = SearchTool({"type": "native", "retrieval_service_url": url, "max_concurrency": concurrency})
    rng = random.Random(0)
    await asyncio.gather(*[one_call(tool, q) for q in rng.sample(questions, 32)])  # warm-up: connections
    print(f"\n## {concurrency} concurrent calls")
    results, started, cpu_started = [], time.perf_counter(), time.process_time()
    for _ in range(rounds):
        results += await asyncio.gather(*[one_call(tool, q) for q in rng.sample(questions, concurrency)])
    elapsed = time.perf_counter() - started
    cpu_ms_per_call = (time.process_time() - cpu_started) * 1000 / len(results)
    ok = [r for r in results if not r["search_failed"] and r["server_latency_s"] is not None]
    overhead_ms = np.asarray([(r["wall_s"] - r["server_latency_s"]) * 1000 for r in ok])
    wall_ms = np.asarray([r["wall_s"] * 1000 for r in ok])
    print(f"{len(results)} calls, {concurrency} concurrent, {rounds} rounds: {len(results) / elapsed:.1f} calls/s, "
          f"errors {len(results) - len(ok)}")
    print(f"tool latency   p50 {np.percentile(wall_ms, 50):7.2f} ms  p99 {np.percentile(wall_ms, 99):7.2f} ms")
    print(f"tool overhead  p50 {np.percentile(overhead_ms, 50):7.2f} ms  p99 {np.percentile(overhead_ms, 99):7.2f} ms"
          "  (latency minus the server's time from request arrival to response)")
    print(f"tool CPU per call {cpu_ms_per_call:.2f} ms (this process: tool, HTTP client, JSON, formatting)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--concurrency", default="1,16,256", help="concurrent calls, comma-separated levels")
    parser.add_argument("--calls", type=int, default=2560, help="calls per level (at least one round)")
    args = parser.parse_args()
    index_dir = index_folder(Path(args.index_root), "bm25", args.corpus, None)
    questions = [row["question"] for row in read_questions(args.qa)]
    with SubprocessServer(["--index", str(index_dir)]) as server:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            asyncio.run(run(f"{server.url}/retrieve", questions, concurrency, max(1, args.calls // concurrency)))


if __name__ == "__main__":
    main()
