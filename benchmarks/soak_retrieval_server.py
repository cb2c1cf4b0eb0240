"""Soak benchmark of the retrieval server (issue 12, item 1; prints numbers, exits 1 on failure).

Starts the real server (`python -m verl_search.server`, a child process) on the dense MiniLM index
over the mini corpus, warms it up with the full load, then keeps `--clients` concurrent aiohttp
clients (single-query requests, distinct random questions and `topk` 1..5, kept-alive
connections) on it for `--seconds`. Prints requests, queries/s, p50/p99 latency, errors, and the
server's RSS (MiB) after warm-up and after the soak. Exits 1 on any error, on no request answered,
or on RSS growth above `--max-growth` percent (default 5).

    python benchmarks/soak_retrieval_server.py --seconds 60            # the issue's soak (30 s warm-up)
    python benchmarks/soak_retrieval_server.py --seconds 10 --json      # CI variant (tests/reliability)

The last line with `--json` is a JSON object of the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from verl_search.datasets import read_questions
from verl_search.server.runner import SubprocessServer


def rss_mb(pid: int) -> float:
    """Current resident set (VmRSS) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def _client(session, url, questions, stop_at, latencies, errors, rng):
    while time.monotonic() < stop_at:
        query, topk = rng.choice(questions), rng.randint(1, 5)
        started = time.monotonic()
        try:
            async with session.post(url, json={"queries": [query], "topk": topk}) as response:
                payload = await response.read()
            if response.status != 200 or len(json.loads(payload)["result"][0]) != topk:
                errors.append(f"HTTP {response.status}: {payload[:100]!r}")
                continue
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            errors.append(repr(exc))
            continue
        latencies.append(time.monotonic() - started)


async def soak(url: str, questions: list[str], clients: int, seconds: float, seed: int = 0) -> dict:
    """`clients` concurrent clients on `POST url` for `seconds`; requests, queries/s, latency, errors."""
    latencies: list[float] = []
    errors: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        started = time.monotonic()
        await asyncio.gather(*[_client(session, url, questions, started + seconds, latencies, errors,
                                       random.Random(seed * 100_000 + i)) for i in range(clients)])
        elapsed = time.monotonic() - started
    ms = np.asarray(latencies or [float("nan")]) * 1000
    return {"requests": len(latencies), "qps": len(latencies) / elapsed, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": len(errors), "first_errors": errors[:3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=str(Path(os.environ.get("VERL_SEARCH_TEST_CACHE", tempfile.gettempdir()))
                                               / "mini_dense_minilm"), help="index folder (default: the dense test index)")
    parser.add_argument("--qa", default="mini-wiki", help="questions: JSONL file or DATASET[:SPLIT]")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60.0, help="soak duration")
    parser.add_argument("--warmup", type=float, default=30.0, help="warm-up duration (same load), seconds")
    parser.add_argument("--max-growth", type=float, default=5.0, help="allowed RSS growth after warm-up, percent")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON on the last line")
    args = parser.parse_args()

    if not (Path(args.index) / "manifest.json").is_file():
        print(f"no index at {args.index}; build one with `verl-search index build` (or run the tests once)")
        return 2
    questions = [row["question"] for row in read_questions(args.qa)]
    with SubprocessServer(["--index", args.index], ready_timeout=300) as server:
        url, pid = f"{server.url}/retrieve", server.process.pid
        warm = asyncio.run(soak(url, questions, args.clients, args.warmup, seed=1))
        rss_warm = rss_mb(pid)
        result = asyncio.run(soak(url, questions, args.clients, args.seconds, seed=2))
        rss_after = rss_mb(pid)
        alive = server.process.poll() is None
    growth = 100 * (rss_after / rss_warm - 1)
    ok = alive and result["errors"] == 0 and warm["errors"] == 0 and result["requests"] > 0 and growth <= args.max_growth
    print(f"# soak: {args.clients} clients, {args.seconds:.0f} s after a {args.warmup:.0f} s warm-up, "
          f"{Path(args.index).name}, {os.cpu_count()} cores")
    print(f"warm-up: {warm['requests']} requests, {warm['errors']} errors")
    print(f"soak: {result['requests']} requests, {result['qps']:.1f} q/s, p50 {result['p50_ms']:.0f} ms, "
          f"p99 {result['p99_ms']:.0f} ms, {result['errors']} errors {result['first_errors'] or ''}")
    print(f"server RSS after warm-up {rss_warm:.1f} MiB, after soak {rss_after:.1f} MiB ({growth:+.2f}%, "
          f"bound {args.max_growth:g}%)")
    print("PASS" if ok else "FAIL")
    if args.json:
        print(json.dumps({**result, "warmup_requests": warm["requests"], "warmup_errors": warm["errors"],
                          "rss_warm_mb": rss_warm, "rss_after_mb": rss_after, "growth_pct": growth, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
