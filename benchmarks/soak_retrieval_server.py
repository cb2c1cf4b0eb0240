"""Soak benchmark of the retrieval server (prints numbers, exits 1 on failure).

Starts the real server (`python -m verl_search.server`, a child process) on the dense MiniLM index
over the mini corpus, warms it up with the full load, then keeps `--clients` concurrent aiohttp
clients (single-query requests, distinct random questions and `topk` 1..5, kept-alive
connections) on it for `--seconds`. Prints requests, queries/s, p50/p99 latency, errors, and the
server's RSS (MiB) after warm-up and after the soak, and the RSS growth per request over the soak:
the Theil-Sen slope of RSS samples (every `--sample-every` seconds) against requests answered, with
its 95% confidence interval (`leak_rate`). Exits 1 on any error, on no request answered, or when the
whole interval lies above `--max-kib-per-request` (default `MAX_KIB_PER_REQUEST`).

    python benchmarks/soak_retrieval_server.py --seconds 60            # the issue's soak (30 s warm-up)
    python benchmarks/soak_retrieval_server.py --seconds 8 --warmup 6 --warmup-requests 768 \\
        --soak-requests 768 --json                                      # CI variant (tests/reliability)

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
from verl_search.server.local import SubprocessServer

#: the leak bound: RSS growth per answered request over the soak (Theil-Sen slope), KiB; the soak fails
#: when the slope's 95% confidence interval lies wholly above it. The dense MiniLM server settles: 9.1 KiB
#: per request over a 60-s soak after a 30-s warm-up, 0.2-0.7 in its last third (`docs/retrieval-service.md`,
#: "No leak under long load"); 22 KiB per request over an 8-s soak after a 10-s warm-up (interval 18-26).
MAX_KIB_PER_REQUEST = 32.0
#: the most seconds a warm-up or soak goes on after its duration while waiting for its request count
MAX_EXTRA_SECONDS = 120.0


def rss_mb(pid: int) -> float:
    """Current resident set (VmRSS) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def _client(session, url, questions, going, latencies, errors, rng):
    while going():
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


async def _sample_rss(pid: int, latencies: list, samples: list, going, every: float) -> None:
    """Every `every` seconds while `going()`, append `(requests answered so far, RSS MiB)` to `samples`."""
    while going():
        samples.append((len(latencies), rss_mb(pid)))
        await asyncio.sleep(every)
    samples.append((len(latencies), rss_mb(pid)))


async def soak(url: str, questions: list[str], clients: int, seconds: float, seed: int = 0, pid: int | None = None,
               sample_every: float = 0.25, min_requests: int = 0) -> dict:
    """`clients` concurrent clients on `POST url` for `seconds` (and on, up to `MAX_EXTRA_SECONDS` more,
    until `min_requests` were answered: a busy machine answers fewer); requests, queries/s, latency,
    errors and, with the server's `pid`, `samples`: `(requests answered, server RSS MiB)` every
    `sample_every` seconds."""
    latencies: list[float] = []
    errors: list[str] = []
    samples: list[tuple[int, float]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        started = time.monotonic()

        def going() -> bool:
            elapsed = time.monotonic() - started
            return elapsed < seconds or (len(latencies) < min_requests and elapsed < seconds + MAX_EXTRA_SECONDS)

        sampler = [_sample_rss(pid, latencies, samples, going, sample_every)] if pid else []
        await asyncio.gather(*[_client(session, url, questions, going, latencies, errors,
                                       random.Random(seed * 100_000 + i)) for i in range(clients)], *sampler)
        elapsed = time.monotonic() - started
    ms = np.asarray(latencies or [float("nan")]) * 1000
    return {"requests": len(latencies), "seconds": elapsed, "qps": len(latencies) / elapsed, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": len(errors), "first_errors": errors[:3], "samples": samples}


def leak_rate(samples: list[tuple[int, float]]) -> dict:
    """The server's RSS growth per request over the soak: the Theil-Sen slope (the median of the
    slopes between every pair of samples; `scipy.stats.theilslopes`) of RSS against requests answered,
    in KiB per request, with its 95% confidence interval.

    One RSS sample is noise (the allocator returns and takes pages, buffers settle): a single
    before/after difference moved by +1.8% and +5.4% between two runs of the same server. A leak
    grows RSS with every request, so it is the trend over many samples; the median of pairwise slopes
    ignores a step (a buffer grown once) that a least-squares line would spread over the whole soak.

    Returns:
        `{"kib_per_request", "kib_per_request_low", "kib_per_request_high", "samples"}` (NaN with
        fewer than 3 distinct request counts).
    """
    from scipy.stats import theilslopes

    requests = np.asarray([r for r, _ in samples], dtype=float)
    rss_kib = np.asarray([m for _, m in samples], dtype=float) * 1024
    if len(np.unique(requests)) < 3:
        nan = float("nan")
        return {"kib_per_request": nan, "kib_per_request_low": nan, "kib_per_request_high": nan, "samples": len(samples)}
    slope, _, low, high = theilslopes(rss_kib, requests, 0.95)
    return {"kib_per_request": float(slope), "kib_per_request_low": float(low), "kib_per_request_high": float(high),
            "samples": len(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=str(Path(os.environ.get("VERL_SEARCH_TEST_CACHE", tempfile.gettempdir()))
                                               / "mini_dense_minilm"), help="index folder (default: the dense test index)")
    parser.add_argument("--qa", default="mini-wiki", help="questions: JSONL file or DATASET[:SPLIT]")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60.0, help="soak duration")
    parser.add_argument("--warmup", type=float, default=30.0, help="warm-up duration (same load), seconds")
    parser.add_argument("--warmup-requests", type=int, default=0,
                        help="go on warming up (at most 120 s more) until this many requests were answered")
    parser.add_argument("--soak-requests", type=int, default=0,
                        help="go on soaking (at most 120 s more) until this many requests were answered")
    parser.add_argument("--max-kib-per-request", type=float, default=MAX_KIB_PER_REQUEST,
                        help="allowed RSS growth per request over the soak (Theil-Sen slope), KiB")
    parser.add_argument("--sample-every", type=float, default=0.25, help="seconds between RSS samples during the soak")
    parser.add_argument("--windows", type=int, default=1,
                        help="also print the slope of each of this many consecutive parts of the soak (settling vs a leak)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON on the last line")
    args = parser.parse_args()

    if not (Path(args.index) / "manifest.json").is_file():
        print(f"no index at {args.index}; build one with `verl-search index build` (or run the tests once)")
        return 2
    questions = [row["question"] for row in read_questions(args.qa)]
    with SubprocessServer(["--index", args.index], ready_timeout=300) as server:
        url, pid = f"{server.url}/retrieve", server.process.pid
        warm = asyncio.run(soak(url, questions, args.clients, args.warmup, seed=1, min_requests=args.warmup_requests))
        rss_warm = rss_mb(pid)
        result = asyncio.run(soak(url, questions, args.clients, args.seconds, seed=2, pid=pid,
                                  sample_every=args.sample_every, min_requests=args.soak_requests))
        rss_after = rss_mb(pid)
        alive = server.process.poll() is None
    growth = 100 * (rss_after / rss_warm - 1)
    samples = result.pop("samples")
    leak = leak_rate(samples)
    ok = (alive and result["errors"] == 0 and warm["errors"] == 0 and result["requests"] > 0
          and not leak["kib_per_request_low"] > args.max_kib_per_request)
    print(f"# soak: {args.clients} clients, {result['seconds']:.0f} s after a {warm['seconds']:.0f} s warm-up, "
          f"{Path(args.index).name}, {os.cpu_count()} cores")
    print(f"warm-up: {warm['requests']} requests, {warm['errors']} errors")
    print(f"soak: {result['requests']} requests, {result['qps']:.1f} q/s, p50 {result['p50_ms']:.0f} ms, "
          f"p99 {result['p99_ms']:.0f} ms, {result['errors']} errors {result['first_errors'] or ''}")
    print(f"server RSS after warm-up {rss_warm:.1f} MiB, after soak {rss_after:.1f} MiB ({growth:+.2f}%)")
    print(f"RSS growth per request (Theil-Sen over {leak['samples']} samples): {leak['kib_per_request']:+.2f} KiB "
          f"(95% CI {leak['kib_per_request_low']:+.2f} .. {leak['kib_per_request_high']:+.2f}; "
          f"bound {args.max_kib_per_request:g} KiB)")
    if args.windows > 1:
        for i, part in enumerate(np.array_split(np.arange(len(samples)), args.windows)):
            window = [samples[j] for j in part]
            rate = leak_rate(window)
            print(f"  part {i + 1}: requests {window[0][0]}..{window[-1][0]}, RSS {window[0][1]:.1f} -> {window[-1][1]:.1f} MiB, "
                  f"{rate['kib_per_request']:+.2f} KiB/request (95% CI {rate['kib_per_request_low']:+.2f} .. "
                  f"{rate['kib_per_request_high']:+.2f})")
    print("PASS" if ok else "FAIL")
    if args.json:
        print(json.dumps({**result, "warmup_requests": warm["requests"], "warmup_errors": warm["errors"],
                          "rss_warm_mb": rss_warm, "rss_after_mb": rss_after, "growth_pct": growth, **leak, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
